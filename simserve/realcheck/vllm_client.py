"""A streaming OpenAI-completions client for a real `vllm serve`, timing every request the way
`vllm bench serve` does (send time, each streamed chunk with its cumulative token count, end).

    python3 -m simserve.realcheck.vllm_client --plan PLAN.json --url http://127.0.0.1:8000 \
        --model NAME --out DIR [--procs 4]

A plan (written by `simserve.realcheck.vllm_plans`) lists requests as scheduled send offsets,
prompt lengths, output lengths and, for Mooncake traces, 512-token block hashes. Prompts are
made of word tokens `t<id>` that the word-level tokenizer (`vllm_tokenizer`) maps one to one
to token ids, so a request's prompt length is exact; requests that share block hashes share
prompt prefixes, which is what vLLM's prefix cache sees. Outputs are forced to their length
(`ignore_eos`, greedy sampling).

Open-loop plans are split round-robin over `--procs` client processes (one Python event loop
cannot read thousands of token streams a second without falling behind); a plan with
`max_concurrency` runs in one process under a semaphore, as `--max-concurrency` does. Every
process timestamps with `time.monotonic()`, the clock vLLM's engine core uses.
Needs aiohttp (not a simserve dependency: it runs beside the server).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import time

import numpy as np

BLOCK = 512           # Mooncake hash block (tokens)
WORD_LO, WORD_HI = 1000, 100000   # token ids used in prompts (clear of special tokens)
_TOKENS = re.compile(rb'"completion_tokens": ?(\d+)')


def prompt_ids(req: dict, seed: int) -> np.ndarray:
    """Token ids of a request's prompt: per-hash blocks when it has hashes, else its own ids."""
    n = int(req["p"])
    if req.get("h"):
        blocks = [np.random.default_rng([seed, 7, int(h)]).integers(WORD_LO, WORD_HI, BLOCK)
                  for h in req["h"]]
        ids = np.concatenate(blocks)[:n]
        if len(ids) < n:  # a trace row whose hashes cover fewer tokens than its length
            extra = np.random.default_rng([seed, 11, int(req["i"])]).integers(
                WORD_LO, WORD_HI, n - len(ids))
            ids = np.concatenate([ids, extra])
        return ids
    return np.random.default_rng([seed, 3, int(req["i"])]).integers(WORD_LO, WORD_HI, n)


def prompt_text(ids: np.ndarray) -> str:
    return " ".join("t%d" % i for i in ids.tolist())


async def _one(session, url, model, req, text, t_start, sem, rows):
    delay = t_start + float(req["t"]) - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    if sem is not None:
        await sem.acquire()
    body = {"model": model, "prompt": text, "max_tokens": int(req["o"]),
            "min_tokens": int(req["o"]), "ignore_eos": True, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True,
                                               "continuous_usage_stats": True}}
    chunks, err, t_send = [], "", time.monotonic()
    try:
        async with session.post(url + "/v1/completions", json=body,
                                headers={"X-Request-Id": req.get("rid", str(req["i"]))}) as resp:
            if resp.status != 200:
                err = f"http {resp.status}: {(await resp.text())[:200]}"
            else:
                async for line in resp.content:
                    if not line.startswith(b"data: "):
                        continue
                    now = time.monotonic()
                    if line.startswith(b"data: [DONE]"):
                        break
                    m = _TOKENS.search(line)
                    if m and b'"text"' in line:
                        chunks.append((now, int(m.group(1))))
    except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
        err = repr(exc)[:200]
    finally:
        t_end = time.monotonic()
        if sem is not None:
            sem.release()
    rows.append({"i": req["i"], "scheduled": t_start + float(req["t"]), "send": t_send,
                 "end": t_end, "chunks": chunks, "prompt": int(req["p"]),
                 "output": int(req["o"]), "error": err})


async def _run(url, model, reqs, texts, t_start, concurrency, rows):
    import aiohttp
    try:
        import uvloop  # noqa: F401
    except ImportError:
        pass
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    conn = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as s:
        await asyncio.gather(*[_one(s, url, model, r, t, t_start, sem, rows)
                               for r, t in zip(reqs, texts)])


def _worker(args):
    url, model, reqs, seed, t_start, concurrency, out = args
    texts = [prompt_text(prompt_ids(r, seed)) for r in reqs]
    rows: list = []
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_run(url, model, reqs, texts, t_start, concurrency, rows))
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    return len(rows)


def run_plan(plan: dict, url: str, model: str, out_dir: str, procs: int = 4,
             lead_s: float = 3.0) -> str:
    """Send every request of `plan`; write `requests.jsonl` (one row per request) and
    `run.json` (plan name, start, wall) into `out_dir`. Returns the requests file."""
    os.makedirs(out_dir, exist_ok=True)
    reqs = plan["requests"]
    conc = plan.get("max_concurrency")
    n = 1 if conc else max(1, min(procs, len(reqs)))
    t_start = time.monotonic() + lead_s  # prompts are built before the first send
    parts = [os.path.join(out_dir, f"part{k}.jsonl") for k in range(n)]
    tag = plan["name"].replace(".", "_")
    reqs = [dict(r, rid=f"{tag}-{r['i']}") for r in reqs]
    jobs = [(url, model, reqs[k::n], plan.get("seed", 0), t_start, conc, parts[k])
            for k in range(n)]
    wall0 = time.time()
    with mp.get_context("fork").Pool(n) as pool:
        pool.map(_worker, jobs)
    out = os.path.join(out_dir, "requests.jsonl")
    rows = []
    for p in parts:
        with open(p) as f:
            rows += [json.loads(x) for x in f]
        os.remove(p)
    rows.sort(key=lambda r: r["i"])
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    with open(os.path.join(out_dir, "run.json"), "w") as f:
        json.dump({"plan": plan["name"], "t_start_mono": t_start, "wall_start": wall0,
                   "wall_s": time.time() - wall0, "procs": n, "max_concurrency": conc,
                   "num_errors": sum(1 for r in rows if r["error"])}, f, indent=1)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", required=True)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--procs", type=int, default=4)
    a = p.parse_args(argv)
    with open(a.plan) as f:
        plan = json.load(f)
    run_plan(plan, a.url, a.model, a.out, a.procs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
