"""Continuous-batching scheduler (pure: time comes in as an argument, nothing sleeps).

One step, as in vLLM's V1 scheduler:

1. running sequences first, in admission order, each asking for the tokens it has not
   computed yet (1 for a decoding sequence, a chunk for a long prefill), within the token
   budget ``max_num_batched_tokens``. When the KV cache has no room, the most recently
   admitted running sequence is preempted (its blocks freed, its computed tokens dropped;
   it goes back to the head of the waiting queue and is recomputed later, mostly from the
   prefix cache).
2. then, if nothing was preempted, waiting sequences in FIFO order while there is budget,
   a free slot (``max_num_seqs``) and KV room. A new sequence first takes the longest
   cached prefix of its blocks (at most ``num_tokens - 1`` tokens: the last token is always
   computed). A sequence whose LoRA adapter is not active while ``max_loras`` adapters are
   is skipped and keeps its place.

With ``scheduling_policy="priority"`` (vLLM's ``--scheduling-policy priority``) the waiting
queue is ordered by (request ``priority``, arrival, arrival order): lower first, and a
preempted or skipped sequence goes back into that order, not to the head. A waiting
sequence never preempts a running one; when the KV cache has no room for a running
sequence, the victim is the running sequence latest in that order (vLLM: the max of
``(priority, arrival_time)``), not the most recently admitted. Under fcfs ``priority`` has no
effect (vLLM 0.32 accepts it and ignores it).

``complete()`` then applies the step: computed tokens advance, full blocks are registered
in the prefix cache and every sequence whose tokens are all computed samples one token.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field

from llmplane.sim.config import SimConfig
from llmplane.sim.kvcache import STORED, BlockPool, block_hash
from llmplane.sim.tokenizer import WordIds, word_index

WAITING, RUNNING, TRANSFERRING, FINISHED, ABORTED = range(5)


class Sequence:
    """One generated sequence (a request with ``n=2`` has two)."""

    __slots__ = (
        "arrival",
        "batch_prefills",
        "blocks",
        "final_blocks",
        "finish_reason",
        "first_step_at",
        "first_token_at",
        "group",
        "hash_seed",
        "hashes",
        "index",
        "last_token_at",
        "lora",
        "num_cached",
        "num_computed",
        "num_output",
        "out_words",
        "preemptions",
        "priority",
        "prompt_len",
        "ready_at",
        "registered",
        "remote_prefill",
        "scheduled_at",
        "seed",
        "serial",
        "status",
        "stop_reason",
        "target_len",
        "text_cut",
        "token_ids",
        "word_start",
    )

    def __init__(
        self,
        prompt_ids: list[int],
        target_len: int,
        seed: int,
        *,
        lora: str | None = None,
        hash_seed: int = 0,
        finish_reason: str = "length",
        stop_reason: str | None = None,
        text_cut: int | None = None,
        remote_prefill: bool = False,
        group: object = None,
        index: int = 0,
        arrival: float = 0.0,
        priority: int = 0,
        word_start: int = 0,
    ) -> None:
        self.token_ids = list(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self.target_len = max(1, target_len)
        self.seed = seed
        self.lora = lora
        self.hash_seed = hash_seed
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        self.text_cut = text_cut
        self.remote_prefill = remote_prefill
        self.group = group
        self.index = index
        self.arrival = arrival
        self.priority = priority
        # Pseudo-words the prompt already ends with (a continuation): generation goes on after
        # them, as the uninterrupted sequence would have (``sim/tokenizer.continuation``).
        self.word_start = word_start
        self.serial = 0  # order of arrival at the scheduler (the last tie-break)
        self.hashes: list[int] = []
        self.blocks: list[int] = []
        self.final_blocks: list[int] = []
        self.num_computed = 0
        self.registered = 0
        self.num_output = 0
        self.out_words: list[int] = []
        self.status = WAITING
        self.ready_at = 0.0
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.scheduled_at: float | None = None  # first admission into the batch
        # With report_timing: the start of the first step after its arrival (the step in
        # progress then ended) and how many sequences prefilled in its prefill step(s).
        self.first_step_at: float | None = None
        self.batch_prefills = 0
        self.num_cached = -1  # prompt tokens from the prefix cache at first admission
        self.preemptions = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def finished(self) -> bool:
        return self.status >= FINISHED

    def order(self) -> tuple[int, float, int]:
        """Its place under the priority policy: lower first (vLLM's ``Request.__lt__``)."""
        return (self.priority, self.arrival, self.serial)

    def ensure_hashes(self, num_blocks: int, block_size: int) -> list[int]:
        hashes, toks = self.hashes, self.token_ids
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else self.hash_seed
            hashes.append(block_hash(parent, toks[i * block_size : (i + 1) * block_size]))
        return hashes


@dataclass
class Step:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    prefill_tokens: int = 0
    decode_seqs: int = 0
    context_tokens: int = 0
    lora_loads: int = 0
    duration: float = 0.0  # modelled seconds (unscaled)
    ttfts: list[float] = field(default_factory=list)  # filled by complete()
    itls: list[float] = field(default_factory=list)


@dataclass
class Stats:
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    # Prompt tokens by where their KV came from, counted with prompt_tokens (first token).
    prompt_cached: int = 0
    prompt_transferred: int = 0
    # Prompt tokens not found in the local prefix cache (what vLLM asks its KV connector for:
    # ``vllm:external_prefix_cache_queries``; the hits are ``prompt_transferred``).
    prompt_uncached: int = 0


class Scheduler:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.block_size = cfg.block_size
        self.pool = BlockPool(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_caching)
        self.timing = cfg.timing
        self.scale = cfg.time_scale
        self.max_num_seqs = cfg.max_num_seqs
        self.token_budget = cfg.max_num_batched_tokens
        self.max_loras = cfg.max_loras
        self.report_timing = cfg.report_timing
        self.by_priority = cfg.scheduling_policy == "priority"
        self.serial = 0
        self.word_ids = WordIds(cfg.vocab_size).ids
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.transferring: list[Sequence] = []
        self.lora_running: Counter[str] = Counter()
        self.lora_waiting: Counter[str] = Counter()
        self.resident_loras: OrderedDict[str, None] = OrderedDict()
        self.stats = Stats()

    # -- queue state -------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.transferring)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.transferring)

    def next_transfer_at(self) -> float | None:
        return min((s.ready_at for s in self.transferring), default=None)

    def add(self, seq: Sequence) -> None:
        seq.status = WAITING
        self.serial += 1
        seq.serial = self.serial
        if self.by_priority:
            self._insert(seq)
        else:
            self.waiting.append(seq)
        if seq.lora:
            self.lora_waiting[seq.lora] += 1

    def abort(self, seq: Sequence) -> None:
        if seq.finished:
            return
        status = seq.status
        seq.status = ABORTED
        if status == RUNNING:
            self.running.remove(seq)
            self._lora_dec(self.lora_running, seq.lora)
        elif status == WAITING:
            self.waiting.remove(seq)
            self._lora_dec(self.lora_waiting, seq.lora)
        elif status == TRANSFERRING:
            self.transferring.remove(seq)
            self._lora_dec(self.lora_waiting, seq.lora)
        self._free(seq)

    # -- helpers -----------------------------------------------------------------------
    @staticmethod
    def _lora_dec(counter: Counter[str], lora: str | None) -> None:
        if lora:
            counter[lora] -= 1
            if counter[lora] <= 0:
                del counter[lora]

    def _insert(self, seq: Sequence) -> None:
        """Put ``seq`` into the waiting queue at its place by ``order()`` (priority policy; the
        queue stays sorted, so the scan from the tail is short for a fresh arrival)."""
        waiting = self.waiting
        key = seq.order()
        i = len(waiting)
        while i and waiting[i - 1].order() > key:
            i -= 1
        waiting.insert(i, seq)

    def _back(self, seq: Sequence) -> None:
        """A sequence returns to the waiting queue (preempted, KV transferred): the head under
        fcfs, its place by priority otherwise."""
        if self.by_priority:
            self._insert(seq)
        else:
            self.waiting.appendleft(seq)

    def _free(self, seq: Sequence) -> None:
        if seq.blocks:
            self.pool.release(seq.blocks)
            seq.blocks = []

    def _grow(self, seq: Sequence, num_new: int) -> bool:
        bs = self.block_size
        need = (seq.num_computed + num_new + bs - 1) // bs - len(seq.blocks)
        if need <= 0:
            return True
        if need > self.pool.num_free:
            return False
        seq.blocks.extend(self.pool.allocate(need))
        return True

    def _preempt(self, seq: Sequence) -> None:
        self._free(seq)
        seq.remote_prefill = False  # recomputed locally from now on
        seq.num_computed = 0
        seq.registered = 0
        seq.status = WAITING
        self._lora_dec(self.lora_running, seq.lora)
        if seq.lora:
            self.lora_waiting[seq.lora] += 1
        self._back(seq)
        self.stats.preemptions += 1
        seq.preemptions += 1

    def _admit_blocks(self, seq: Sequence, upto_tokens: int, budget: int = 0) -> bool:
        """Give a new sequence its cached prefix and blocks for ``upto_tokens`` tokens, or for
        its prefix plus ``budget`` more (what this step computes); all or nothing, as vLLM's
        ``allocate_slots``: a sequence that stays waiting holds no blocks (else two sequences
        could each hold part of what the other needs, and neither ever runs)."""
        bs = self.block_size
        pool = self.pool
        max_hit = (seq.num_tokens - 1) // bs
        hashes = seq.ensure_hashes(seq.num_tokens // bs, bs)
        hit = pool.lookup(hashes, max_hit)
        ref = pool.ref
        hit_free = sum(1 for b in hit if ref[b] == 0)
        cached_tokens = len(hit) * bs
        upto = max(upto_tokens, cached_tokens, min(seq.num_tokens, cached_tokens + budget))
        need = (upto + bs - 1) // bs - len(hit)
        if need + hit_free > pool.num_free:
            return False
        pool.touch(hit)
        seq.blocks = hit + pool.allocate(need)
        seq.num_computed = cached_tokens
        seq.registered = len(hit)
        self.stats.prefix_queries += seq.num_tokens
        self.stats.prefix_hits += cached_tokens
        if seq.num_cached < 0:
            seq.num_cached = cached_tokens
        return True

    def _activate_lora(self, lora: str, step: Step) -> None:
        res = self.resident_loras
        if lora in res:
            res.move_to_end(lora)
            return
        step.lora_loads += 1
        res[lora] = None
        while len(res) > self.max_loras:
            for name in res:
                if name not in self.lora_running:
                    del res[name]
                    break
            else:
                break

    # -- one step ----------------------------------------------------------------------
    def schedule(self, now: float) -> Step:
        step = Step()
        scheduled = step.scheduled
        budget = self.token_budget

        if self.transferring:
            ready = [s for s in self.transferring if s.ready_at <= now]
            if ready:
                self.transferring = [s for s in self.transferring if s.ready_at > now]
                for s in reversed(ready):
                    s.status = WAITING
                    self._back(s)

        if self.report_timing:
            for seq in self.waiting:
                if seq.first_step_at is None:
                    seq.first_step_at = now

        running = self.running
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            num_new = min(seq.num_tokens - seq.num_computed, budget)
            if num_new <= 0:
                i += 1
                continue
            ok = True
            while not self._grow(seq, num_new):
                if self.by_priority:  # the latest in priority order, wherever it runs
                    v = max(range(len(running)), key=lambda k: running[k].order())
                    victim = running.pop(v)
                    if v < i:  # already scheduled in this step: give its tokens back
                        i -= 1
                        for k, (s, n) in enumerate(scheduled):
                            if s is victim:
                                budget += n
                                del scheduled[k]
                                break
                else:
                    victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    ok = False
                    break
            if not ok:
                break
            scheduled.append((seq, num_new))
            budget -= num_new
            i += 1

        if not preempted:
            waiting = self.waiting
            skipped: list[Sequence] = []
            max_loras = self.max_loras
            lora_running = self.lora_running
            while waiting and budget > 0 and len(running) < self.max_num_seqs:
                seq = waiting[0]
                lora = seq.lora
                if lora and lora not in lora_running and len(lora_running) >= max_loras:
                    skipped.append(waiting.popleft())
                    continue
                if seq.remote_prefill and not seq.blocks:
                    # PD decode: reserve blocks for the whole prompt, then wait for the KV.
                    hit_before = self.stats.prefix_hits
                    if not self._admit_blocks(seq, seq.num_tokens):
                        break
                    local = self.stats.prefix_hits - hit_before
                    seq.num_computed = seq.num_tokens - 1
                    waiting.popleft()
                    seq.status = TRANSFERRING
                    seq.ready_at = now + self.timing.transfer_time(seq.prompt_len - local) * (
                        self.scale
                    )
                    if seq.ready_at <= now:
                        seq.status = WAITING
                        waiting.appendleft(seq)
                        # fall through to admission below on the next loop turn
                    else:
                        self.transferring.append(seq)
                    continue
                if not seq.blocks and not self._admit_blocks(seq, 0, budget):
                    break
                num_new = min(seq.num_tokens - seq.num_computed, budget)
                if not self._grow(seq, num_new):
                    break
                waiting.popleft()
                seq.status = RUNNING
                if seq.scheduled_at is None:
                    seq.scheduled_at = now
                running.append(seq)
                if lora:
                    self._lora_dec(self.lora_waiting, lora)
                    lora_running[lora] += 1
                    self._activate_lora(lora, step)
                scheduled.append((seq, num_new))
                budget -= num_new
            if skipped:
                waiting.extendleft(reversed(skipped))

        prefill = decode = ctx = prefilling = 0
        for seq, n in scheduled:
            if n == 1 and (seq.num_output > 0 or seq.remote_prefill):
                decode += 1
                ctx += seq.num_computed
            else:
                prefill += n
                prefilling += 1
        if self.report_timing and prefilling:
            for seq, _ in scheduled:
                if seq.num_output == 0 and seq.batch_prefills < prefilling:
                    seq.batch_prefills = prefilling
        step.prefill_tokens = prefill
        step.decode_seqs = decode
        step.context_tokens = ctx
        step.duration = self.timing.step_time(prefill, decode, ctx, step.lora_loads)
        return step

    def complete(self, step: Step, now: float) -> tuple[list[Sequence], list[Sequence]]:
        """Apply a step; returns (sequences that got a token, sequences that finished)."""
        bs = self.block_size
        pool = self.pool
        word_ids = self.word_ids
        stats = self.stats
        emitted: list[Sequence] = []
        finished: list[Sequence] = []
        ttfts, itls = step.ttfts, step.itls
        for seq, n in step.scheduled:
            if seq.status != RUNNING:
                continue  # aborted or preempted while the step ran
            seq.num_computed += n
            full = seq.num_computed // bs
            if full > seq.registered and pool.enable_caching:
                hashes = seq.ensure_hashes(full, bs)
                blocks = seq.blocks
                events = pool.events
                for b in range(seq.registered, full):
                    if pool.register(blocks[b], hashes[b]) and events is not None:
                        parent = hashes[b - 1] if b else None
                        tokens = seq.token_ids[b * bs : (b + 1) * bs]
                        events.append((STORED, hashes[b], parent, tokens, seq.lora))
                seq.registered = full
            if seq.num_computed < seq.num_tokens:
                continue  # partial prefill chunk
            k = seq.num_output
            w = word_index(seq.seed, seq.word_start + k)
            seq.out_words.append(w)
            seq.token_ids.append(word_ids[w])
            seq.num_output = k + 1
            stats.generation_tokens += 1
            if k == 0:
                seq.first_token_at = now
                stats.prompt_tokens += seq.prompt_len
                cached = min(max(0, seq.num_cached), seq.prompt_len)
                stats.prompt_cached += cached
                stats.prompt_uncached += seq.prompt_len - cached
                if seq.remote_prefill:  # all but the last prompt token came over the wire
                    stats.prompt_transferred += max(0, seq.prompt_len - 1 - cached)
                ttfts.append(now - seq.arrival)
            else:
                itls.append(now - seq.last_token_at)
            seq.last_token_at = now
            emitted.append(seq)
            if k + 1 >= seq.target_len:
                seq.status = FINISHED
                seq.final_blocks = seq.blocks
                finished.append(seq)
        if finished:
            self.running = [s for s in self.running if s.status == RUNNING]
            for seq in finished:
                self._lora_dec(self.lora_running, seq.lora)
                self._free(seq)
        return emitted, finished
