"""Continuous-batching scheduler of the simulator (pure, no event loop)."""

from llmplane.sim.config import SimConfig, TimingModel
from llmplane.sim.scheduler import FINISHED, RUNNING, WAITING, Scheduler, Sequence


def cfg(**kw) -> SimConfig:
    base = dict(model="m", num_blocks=64, block_size=4, max_num_seqs=8, time_scale=0.0)
    base.update(kw)
    return SimConfig(**base)


def seq(prompt, out=4, **kw) -> Sequence:
    return Sequence(list(prompt), out, seed=len(prompt), **kw)


def run(s: Scheduler, limit: int = 10_000) -> list:
    steps = []
    t = 0.0
    while s.has_work() and len(steps) < limit:
        step = s.schedule(t)
        t += 1.0
        s.complete(step, t)
        steps.append(step)
    return steps


def test_a_repeated_prompt_hits_the_prefix_cache():
    s = Scheduler(cfg())
    a = seq(range(20), out=3)
    s.add(a)
    run(s)
    assert a.status == FINISHED and a.num_output == 3
    assert s.stats.prefix_hits == 0 and s.stats.prefix_queries == 20
    b = seq(range(20), out=3)
    s.add(b)
    step = s.schedule(100.0)
    # 20 tokens: 4 full blocks cached but the last token is always computed -> 16 hit
    assert b.num_computed == 16 and s.stats.prefix_hits == 16
    assert step.prefill_tokens == 4
    s.complete(step, 101.0)
    run(s)
    assert s.pool.num_used == 0


def test_prefill_cost_falls_with_cached_tokens():
    t = TimingModel()
    s = Scheduler(cfg(num_blocks=512))
    s.add(seq(range(1000), out=1))
    first = s.schedule(0.0)
    s.complete(first, 1.0)
    s.add(seq(range(1000), out=1))
    second = s.schedule(2.0)
    assert first.prefill_tokens == 1000 and second.prefill_tokens == 1000 - 996
    assert second.duration < first.duration
    assert first.duration == t.step_time(1000, 0, 0)


def test_waiting_queue_beyond_max_num_seqs():
    s = Scheduler(cfg(max_num_seqs=2))
    seqs = [seq([i, i + 1, i + 2], out=5) for i in range(0, 40, 10)]
    for q in seqs:
        s.add(q)
    s.complete(s.schedule(0.0), 1.0)
    assert s.num_running == 2 and s.num_waiting == 2
    assert [q.status for q in seqs] == [RUNNING, RUNNING, WAITING, WAITING]
    run(s)
    assert all(q.status == FINISHED for q in seqs)


def test_decode_step_time_grows_with_the_batch():
    t = TimingModel()
    assert t.step_time(0, 64, 64 * 500) > t.step_time(0, 8, 8 * 500) > t.step_time(0, 1, 500)
    assert t.step_time(0, 0, 0) == 0.0


def test_preemption_when_blocks_run_out_and_everything_still_finishes():
    s = Scheduler(cfg(num_blocks=6, block_size=4, max_num_seqs=4))
    seqs = [seq(range(i * 100, i * 100 + 6), out=10) for i in range(3)]
    for q in seqs:
        s.add(q)
    run(s)
    assert s.stats.preemptions > 0
    assert all(q.status == FINISHED and q.num_output == 10 for q in seqs)
    assert s.pool.num_used == 0
    # output text is the same as without preemption
    alone = Scheduler(cfg(num_blocks=64))
    again = seq(range(0, 6), out=10)
    alone.add(again)
    run(alone)
    assert again.out_words == seqs[0].out_words


def test_chunked_prefill_respects_the_token_budget():
    s = Scheduler(cfg(max_num_batched_tokens=8))
    q = seq(range(20), out=2)
    s.add(q)
    steps = run(s)
    assert [st.prefill_tokens for st in steps[:3]] == [8, 8, 4]
    assert q.first_token_at == 3.0


def test_lora_slots_limit_active_adapters():
    s = Scheduler(cfg(max_loras=1))
    a = seq(range(8), out=3, lora="a")
    b = seq(range(8), out=3, lora="b")
    base = seq(range(50, 58), out=3)
    for q in (a, b, base):
        s.add(q)
    step = s.schedule(0.0)
    assert step.lora_loads == 1
    assert a.status == RUNNING and b.status == WAITING and base.status == RUNNING
    assert dict(s.lora_running) == {"a": 1} and dict(s.lora_waiting) == {"b": 1}
    s.complete(step, 1.0)
    steps = run(s)
    assert b.status == FINISHED and sum(st.lora_loads for st in steps) == 1
    assert not s.lora_running and not s.lora_waiting


def test_lora_requests_do_not_share_cache_with_the_base_model():
    s = Scheduler(cfg())
    s.add(seq(range(20), out=1))
    run(s)
    s.add(seq(range(20), out=1, lora="a", hash_seed=12345))
    s.schedule(0.0)
    assert s.stats.prefix_hits == 0


def test_remote_prefill_skips_prefill_cost():
    s = Scheduler(cfg())
    q = seq(range(40), out=2, remote_prefill=True)
    s.add(q)
    step = s.schedule(0.0)
    assert step.prefill_tokens == 0 and step.decode_seqs == 1
    s.complete(step, 1.0)
    assert q.num_output == 1


def test_remote_prefill_waits_for_the_transfer():
    s = Scheduler(cfg(time_scale=1.0))
    q = seq(range(40), out=2, remote_prefill=True)
    s.add(q)
    assert not s.schedule(0.0).scheduled
    assert s.num_waiting == 1 and s.pool.num_used == 10  # blocks reserved for the KV
    ready = s.next_transfer_at()
    assert ready is not None and ready > 0
    assert s.schedule(ready).scheduled


def test_abort_frees_blocks():
    s = Scheduler(cfg())
    q = seq(range(30), out=50)
    s.add(q)
    s.complete(s.schedule(0.0), 1.0)
    assert s.pool.num_used > 0
    s.abort(q)
    assert s.pool.num_used == 0 and not s.has_work()


def admitted_order(policy: str, priorities: list[int]) -> list[int]:
    """One sequence running alone (max_num_seqs 1), then sequences with ``priorities`` queued
    in that order: the indexes in the order they are admitted."""
    s = Scheduler(cfg(max_num_seqs=1, scheduling_policy=policy))
    s.add(seq(range(900, 904), out=3))
    s.complete(s.schedule(0.0), 1.0)
    queued = [
        seq(range(i * 10, i * 10 + 4), out=2, priority=p, arrival=1.0 + i)
        for i, p in enumerate(priorities)
    ]
    for q in queued:
        s.add(q)
    run(s)
    return sorted(range(len(queued)), key=lambda i: queued[i].scheduled_at or 0.0)


def test_priority_policy_admits_lower_priority_values_first_then_by_arrival():
    # vLLM: lower "priority" first; ties by arrival time (then arrival order).
    assert admitted_order("priority", [2, 2, 0, 1, 0]) == [2, 4, 3, 0, 1]


def test_fcfs_ignores_priority():
    assert admitted_order("fcfs", [2, 2, 0, 1, 0]) == [0, 1, 2, 3, 4]


def test_equal_arrival_times_keep_arrival_order_under_priority():
    s = Scheduler(cfg(max_num_seqs=1, scheduling_policy="priority"))
    seqs = [seq(range(i * 10, i * 10 + 4), out=1, priority=1) for i in range(4)]
    for q in seqs:
        s.add(q)
    run(s)
    assert [q.scheduled_at for q in seqs] == sorted(q.scheduled_at for q in seqs)
    assert len({q.scheduled_at for q in seqs}) == 4


def test_priority_policy_preempts_the_lowest_priority_running_sequence():
    # Room for two 8-token sequences' prompts, not their growth: one must be preempted. Under
    # fcfs the most recently admitted goes (the high-priority one here); under priority the
    # one with the higher "priority" value, whatever its place in the running list.
    def victim(policy: str) -> str:
        s = Scheduler(cfg(num_blocks=5, block_size=4, max_num_seqs=4, scheduling_policy=policy))
        low = seq(range(0, 8), out=6, priority=5, arrival=0.0)
        high = seq(range(100, 108), out=6, priority=0, arrival=1.0)
        s.add(low)
        s.add(high)
        run(s)
        assert low.status == high.status == FINISHED
        assert low.preemptions + high.preemptions >= 1
        return "low" if low.preemptions and not high.preemptions else "high"

    assert victim("priority") == "low"
    assert victim("fcfs") == "high"
