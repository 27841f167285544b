"""Cross-check our load generator against guidellm on the same fleet, rate and lengths.

    python -m bench.guidellm_check [--rate 4] [--requests 120] [--no-write]

Fleet: 2 sims (real time, ``--time-scale 1``) behind the llmplane gateway (default profile).
guidellm (PyPI, in its own venv ``$GUIDELLM_VENV``, default /tmp/guidellm-venv: its
torch/transformers pins clash with ours) runs a Poisson profile at ``--rate`` with synthetic
text; it cannot download a tokenizer here, so a character-level one (one token per ASCII
character, so 4 of its tokens are one sim token) is built offline with
``tokenizers`` and saved with ``transformers.PreTrainedTokenizerFast.save_pretrained``
(``--tokenizer-dir``). Then our generator (bench.routing's client) sends the same number of
requests at the same rate with the prompt and output token counts guidellm's requests had
(read back from its report), and the two TTFT distributions and throughputs are compared.
Writes the report section ``guidellm`` of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench import workloads as wl
from bench.common import (
    RESULTS,
    gateway_proc,
    launch,
    machine,
    machine_line,
    percentile,
    store_objects,
    table,
    write_section,
)
from bench.routing import one_request
from llmplane.testing import Process

VENV = Path(os.environ.get("GUIDELLM_VENV", "/tmp/guidellm-venv"))

_BUILD_TOKENIZER = r"""
import sys
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {"[UNK]": 0, "[PAD]": 1, "<s>": 2, "</s>": 3}
for c in [chr(i) for i in range(32, 127)] + ["\n", "\t"]:
    vocab.setdefault(c, len(vocab))
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
tok.decoder = decoders.Fuse()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                        bos_token="<s>", eos_token="</s>").save_pretrained(sys.argv[1])
"""


def build_tokenizer(path: Path) -> None:
    if (path / "tokenizer.json").exists():
        return
    subprocess.run([str(VENV / "bin" / "python"), "-c", _BUILD_TOKENIZER, str(path)], check=True)


def run_guidellm(url: str, model: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    scenario = {
        "backend": {
            "kind": "openai_http",
            "target": url,
            "model": model,
            "request_format": "/v1/chat/completions",
        },
        "profile": {"kind": "poisson", "rate": [args.rate]},
        "data": [
            {
                "kind": "synthetic_text",
                "prompt_tokens": args.prompt_tokens,
                "output_tokens": args.output_tokens,
            }
        ],
        "constraints": [
            {"kind": "max_requests", "count": args.requests},
            {"kind": "max_duration", "seconds": args.requests / args.rate * 3},
        ],
        "tokenizer": {"kind": "huggingface_auto", "model": str(args.tokenizer_dir)},
        "outputs": [{"kind": "json", "path": str(out)}],
    }
    spec = out.with_suffix(".scenario.json")
    spec.write_text(json.dumps({"spec": scenario}))
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            str(VENV / "bin" / "guidellm"),
            "run",
            "--scenario",
            str(spec),
            "--disable-console-interactive",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"guidellm failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return {"wall": time.monotonic() - t0, "stdout": proc.stdout[-4000:]}


def _walk(doc: Any, key: str) -> list[Any]:
    found = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == key:
                found.append(v)
            found += _walk(v, key)
    elif isinstance(doc, list):
        for v in doc:
            found += _walk(v, key)
    return found


def guidellm_requests(report: Path) -> list[dict[str, Any]]:
    """Per-request records of successful requests from a guidellm JSON report."""
    doc = json.loads(report.read_text())
    out = []
    for reqs in _walk(doc, "requests"):
        if isinstance(reqs, dict) and "successful" in reqs:
            out += [r for r in reqs["successful"] if isinstance(r, dict)]
    return out


def server_view(addrs: list[str]) -> dict[str, float]:
    """Sums and counts of the sims' own TTFT and end-to-end histograms."""
    import urllib.request

    out: dict[str, float] = {}
    for a in addrs:
        with urllib.request.urlopen(f"http://{a}/metrics", timeout=5) as r:
            text = r.read().decode()
        for line in text.splitlines():
            for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
                for part in ("_sum", "_count"):
                    if line.startswith(f"vllm:{name}{part}{{"):
                        key = name + part
                        out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def server_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    res = {}
    for name, key in (
        ("time_to_first_token_seconds", "srv_ttft"),
        ("e2e_request_latency_seconds", "srv_e2e"),
    ):
        n = d.get(name + "_count", 0.0)
        res[key] = d.get(name + "_sum", 0.0) / n if n else float("nan")
    return res


async def run_ours(
    url: str, model: str, n: int, rate: float, prompt_tokens: int, output_tokens: int
) -> dict[str, Any]:
    rng = random.Random(42)
    arrivals = wl.poisson_arrivals(random.Random(7), n, rate)
    bodies = [
        orjson.dumps(
            wl.Request(
                [{"role": "user", "content": wl.text(rng, prompt_tokens)}], output_tokens
            ).body(model)
        )
        for _ in range(n)
    ]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        tasks = []
        for t, body in zip(arrivals, bodies, strict=True):
            delay = start + t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one_request(session, url, body, 120)))
        results = await asyncio.gather(*tasks)
        span = time.perf_counter() - start
    offered = (n - 1) / (arrivals[-1] - arrivals[0]) if n > 1 else float("nan")
    return {"results": results, "span": span, "offered": offered}


def summarize(ttft: list[float], e2e: list[float], tokens: float, span: float) -> dict[str, float]:
    return {
        "n": len(ttft),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p90": percentile(ttft, 90),
        "e2e_p50": percentile(e2e, 50),
        "rps": len(e2e) / span if span else float("nan"),
        "tok_s": tokens / span if span else float("nan"),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--requests", type=int, default=120)
    p.add_argument(
        "--prompt-tokens", type=int, default=2048, help="in guidellm's tokenizer (characters)"
    )
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument(
        "--tokenizer-dir", type=Path, default=Path(tempfile.gettempdir()) / "bench-char-tokenizer"
    )
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    if not (VENV / "bin" / "guidellm").exists():
        raise SystemExit(
            f"guidellm not found in {VENV}: python -m venv {VENV} && {VENV}/bin/pip install guidellm"
        )
    info = machine()
    build_tokenizer(args.tokenizer_dir)
    state = tempfile.mkdtemp(prefix="bench-guidellm-")
    procs: list[Process] = []
    try:
        sims = [
            launch(
                f"sim{i}",
                [
                    "python",
                    "-m",
                    "llmplane.sim",
                    "--model",
                    "sim-model",
                    "--port",
                    "0",
                    "--seed",
                    str(i),
                    "--time-scale",
                    "1",
                ],
            )
            for i in range(2)
        ]
        procs += sims
        addrs = [s.ready() for s in sims]
        from llmplane.gateway.discovery.store_endpoints import endpoint_object

        store_objects(
            state, *(endpoint_object(f"sim{i}", a, "sim-model") for i, a in enumerate(addrs))
        )
        gw = gateway_proc(state)
        procs.append(gw)
        base = f"http://{gw.ready()}"
        gw.wait_http(
            f"{base}/v1/chat/completions",
            b'{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1}',
        )
        report = Path(state) / "guidellm.json"
        v0 = server_view(addrs)
        run_guidellm(base, "sim-model", args, report)
        v1 = server_view(addrs)
        records = guidellm_requests(report)
        ttft = [
            r["time_to_first_token_ms"] / 1000 for r in records if r.get("time_to_first_token_ms")
        ]
        e2e = [r["request_latency"] for r in records if r.get("request_latency") is not None]
        prompt = [r["prompt_tokens"] for r in records if r.get("prompt_tokens") is not None]
        output = [r["output_tokens"] for r in records if r.get("output_tokens") is not None]
        starts = [r["request_start_time"] for r in records if r.get("request_start_time")]
        ends = [r["request_end_time"] for r in records if r.get("request_end_time")]
        span = (max(ends) - min(starts)) if starts and ends else float("nan")
        theirs = summarize(ttft, e2e, sum(output), span)
        theirs.update(server_means(v0, v1))
        targeted = sorted(
            r["info"]["timings"]["targeted_start"]
            for r in records
            if (r.get("info") or {}).get("timings", {}).get("targeted_start")
        )
        if len(targeted) > 1:
            theirs["offered_rps"] = (len(targeted) - 1) / (targeted[-1] - targeted[0])
        # guidellm reports the server's usage counts (sim tokens: 4 characters each, while its
        # own tokenizer counts characters).
        sim_prompt = round(sum(prompt) / len(prompt)) if prompt else args.prompt_tokens // 4
        sim_output = round(sum(output) / len(output)) if output else args.output_tokens
        print(
            f"guidellm: {theirs} (prompt {sim_prompt}, output {sim_output} tokens as the sim counts)"
        )
        # Ours: the same count, the rate guidellm actually offered (its schedule's targeted start
        # times) and the token counts the sim saw for guidellm's requests (our text is 4
        # characters a sim token; the chat template adds 6).
        v2 = server_view(addrs)
        res = asyncio.run(
            run_ours(
                f"{base}/v1/chat/completions",
                "sim-model",
                len(records) or args.requests,
                theirs.get("offered_rps", args.rate),
                max(1, sim_prompt - 6),
                sim_output,
            )
        )
        ok = [r for r in res["results"] if r["ok"]]
        ours = summarize(
            [r["ttft"] for r in ok],
            [r["e2e"] for r in ok],
            sum(r["tokens"] for r in ok),
            res["span"],
        )
        ours["offered_rps"] = res["offered"]
        ours.update(server_means(v2, server_view(addrs)))
        print(f"ours:     {ours}")
    finally:
        for pr in reversed(procs):
            pr.stop()
        shutil.rmtree(state, ignore_errors=True)
    if args.no_write:
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "guidellm.json").write_text(
        json.dumps({"guidellm": theirs, "ours": ours, "machine": info}, indent=1)
    )
    rows = [
        [
            name,
            f"{d.get('offered_rps', float('nan')):.2f}",
            d["n"],
            f"{d['ttft_p50'] * 1000:.1f}",
            f"{d['ttft_p90'] * 1000:.1f}",
            f"{d['e2e_p50'] * 1000:.0f}",
            f"{d['rps']:.2f}",
            f"{d['tok_s']:.0f}",
            f"{d['srv_ttft'] * 1000:.1f}",
            f"{d['srv_e2e'] * 1000:.0f}",
        ]
        for name, d in (("guidellm", theirs), ("bench (ours)", ours))
    ]
    text = (
        f"Command: `python -m bench.guidellm_check --rate {args.rate:g} --requests {args.requests}` "
        f"({machine_line(info, os.getloadavg())}). 2 sims in real time (`--time-scale 1`) behind the "
        f"llmplane gateway; guidellm {args.prompt_tokens}-token prompts (its character tokenizer) = "
        f"{sim_prompt} sim tokens, {sim_output} output tokens; Poisson at {args.rate:g} req/s, "
        "asked of guidellm (it offered the rate in the table), then ours at the rate guidellm offered "
        "with the same counts.\n\n"
        + table(
            [
                "generator",
                "offered req/s",
                "requests",
                "TTFT p50 ms",
                "TTFT p90 ms",
                "e2e p50 ms",
                "req/s",
                "out tok/s",
                "server TTFT mean ms",
                "server e2e mean ms",
            ],
            rows,
        )
    )
    print(f"wrote {write_section('guidellm', text)}")


if __name__ == "__main__":
    main()
