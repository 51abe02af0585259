"""Device plan: vLLM 0.22.1's in-process clients on one H200, in one call of <= 10 minutes.

Measures what `api_server: false` and `offline: true` model (simserve/cost/host.py
`IN_PROCESS`): the client-side cost of `AsyncLLM` with token ids (add_request, the hand-off
to the engine core, `process_outputs`), and `LLM.generate` on a list. Run after the payload
is on the machine (validation/vllm-h200/README.md, calls 1-4: `.vllm/` parts, wheels, stub):

    python3 benchmarks/inprocess_vllm.py --out $OUT [--model llama-3.1-8b] [--budget-s 540]

Writes under OUT:
- `async-<plan>.jsonl`: per request, its add time, every streamed delta's receive time and
  token count, vLLM's own per-request timestamps (arrival, queued, scheduled, first/last
  token), all on `time.monotonic()`;
- `offline-<plan>.json`: `LLM.generate` wall time for the list, per request token counts and
  vLLM's timestamps;
- `probe/`: the engine core's step log (`simserve.realcheck.vllm_probe`), so
  `step_diff` can lock a replay to it;
- `meta.json`: versions, engine configuration, the plans.
Plans: `short` (32-token prompts, 16 outputs) at 100 req/s and all at once, and random
1024/128 at 16 req/s (the API-server runs' plans, for a like-for-like TTFT comparison);
offline: 600 short and 200 random requests.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANS = {"short-r100": (32, 16, 800, 100.0), "short-rinf": (32, 16, 600, None),
         "random-r16": (1024, 128, 200, 16.0)}
OFFLINE = {"short": (32, 16, 600), "random": (1024, 128, 200)}


def _prompts(n: int, length: int, seed: int):
    import random
    rng = random.Random(seed)
    return [[rng.randrange(1000, 30000) for _ in range(length)] for _ in range(n)]


def _stats(out) -> dict:
    m = getattr(out, "metrics", None)
    keys = ("arrival_time", "queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
    return {k: getattr(m, k, None) for k in keys} if m is not None else {}


async def _async_plan(engine, name: str, out_dir: str) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    plen, olen, n, rate = PLANS[name]
    sp = SamplingParams(max_tokens=olen, ignore_eos=True, temperature=0, detokenize=False,
                        output_kind=RequestOutputKind.DELTA)
    rows = []

    async def one(i: int, ids: list, at: float):
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        t_add = time.monotonic()
        chunks, last = [], None
        async for o in engine.generate(TokensPrompt(prompt_token_ids=ids), sp, f"{name}-{i}"):
            chunks.append((time.monotonic(), len(o.outputs[0].token_ids)))
            last = o
        rows.append({"i": i, "add": t_add, "chunks": chunks, "vllm": _stats(last)})

    t0 = time.monotonic() + 0.2
    ps = _prompts(n, plen, hash(name) % 1000)
    await asyncio.gather(*(one(i, p, t0 + (i / rate if rate else 0.0)) for i, p in enumerate(ps)))
    with open(os.path.join(out_dir, f"async-{name}.jsonl"), "w") as f:
        for r in sorted(rows, key=lambda r: r["i"]):
            f.write(json.dumps(r) + "\n")


def run_async(model_dir: str, out_dir: str) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM
    args = AsyncEngineArgs(model=model_dir, load_format="dummy", skip_tokenizer_init=True)
    engine = AsyncLLM.from_engine_args(args)

    async def go():
        await _async_plan(engine, "short-r100", out_dir)   # warms every shape first
        for name in PLANS:
            await _async_plan(engine, name, out_dir)
    asyncio.run(go())
    engine.shutdown()


def run_offline(model_dir: str, out_dir: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    llm = LLM(model=model_dir, load_format="dummy", skip_tokenizer_init=True)
    for name, (plen, olen, n) in OFFLINE.items():
        sp = SamplingParams(max_tokens=olen, ignore_eos=True, temperature=0, detokenize=False)
        ps = [TokensPrompt(prompt_token_ids=p) for p in _prompts(n, plen, 7)]
        llm.generate(ps[:8], sp, use_tqdm=False)            # warm-up
        t = time.monotonic()
        outs = llm.generate(ps, sp, use_tqdm=False)
        wall = time.monotonic() - t
        with open(os.path.join(out_dir, f"offline-{name}.json"), "w") as f:
            json.dump({"start": t, "wall_s": wall, "requests": [
                {"output": len(o.outputs[0].token_ids), "vllm": _stats(o)} for o in outs]}, f)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--mode", choices=("async", "offline", "both"), default="both")
    a = ap.parse_args(argv)
    sys.path.insert(0, REPO)
    from simserve.realcheck import vllm_campaign as C
    from simserve.realcheck.vllm_tokenizer import model_dir
    C.setup(None, None)                                      # payload -> site-packages
    os.environ.update(C.ENV, SIMSERVE_PROBE_DIR=os.path.join(a.out, "probe"))
    sys.path[:0] = [os.path.join(C.ROOT, "probe_site"), C.SITE]
    import simserve_vllm_probe   # noqa: F401  (the engine core's step log)
    simserve_vllm_probe.install()
    md = model_dir(a.model, os.path.join(C.ROOT, "models"))
    os.makedirs(a.out, exist_ok=True)
    import vllm
    with open(os.path.join(a.out, "meta.json"), "w") as f:
        json.dump({"vllm": vllm.__version__, "model": a.model, "plans": PLANS,
                   "offline": OFFLINE, "clock": "time.monotonic"}, f, indent=1)
    if a.mode in ("async", "both"):
        run_async(md, a.out)
    if a.mode in ("offline", "both"):
        run_offline(md, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
