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

Afterwards, here, on the unpacked folder:

    python benchmarks/inprocess_vllm.py --summarize DIR

prints, per plan, what `IN_PROCESS` (simserve/cost/host.py) holds against what was measured
(the hand-off `add` -> engine-core queue, the client's output path `first_token_ts` -> the
delta's arrival, per-request add cost from the offline wall) and simserve's `api_server:
false, detokenize: false` replay of the same adds (mean TTFT and TPOT, real and simulated).
`--dry-run` checks the plan here without a GPU: the payload parts a call carries, the plans'
duration, and the summary on a synthetic folder in the run's layout.
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


# -- afterwards: the measured in-process costs against IN_PROCESS and simserve's replay --------
def _rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


def _pct(q, xs) -> float:
    import numpy as np
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if xs else float("nan")


def simulated(name: str, rows: list[dict], model: str) -> dict:
    """simserve's `vllm` engine, in-process client without detokenising, on the real adds."""
    import numpy as np
    from simserve.hardware.setup import HardwareConfig
    from simserve.run import simulate_point
    from simserve.workload.spec import Workload
    plen, olen, _, _ = PLANS[name]
    t = np.array([r["add"] for r in rows]) - min(r["add"] for r in rows)
    w = Workload(arrival_s=t, prompt_tokens=np.full(len(t), plen), name=name,
                 output_tokens=np.full(len(t), olen))
    rec = simulate_point(w, model, HardwareConfig(gpu="h200-sxm"), "vllm", engine="vllm",
                         api_server=False, detokenize=False).records
    ttft = rec.first_token_s - rec.arrival_s
    tpot = (rec.finish_s - rec.first_token_s) / np.maximum(rec.output_tokens - 1, 1)
    return {"ttft_ms": float(np.mean(ttft) * 1e3), "tpot_ms": float(np.mean(tpot) * 1e3)}


def summarize(folder: str) -> list[dict]:
    """Per plan: the measured client-side costs and simserve's replay, real against sim."""
    sys.path.insert(0, REPO)
    from simserve.cost.host import IN_PROCESS
    with open(os.path.join(folder, "meta.json")) as f:
        meta = json.load(f)
    out = []
    for name in PLANS:
        path = os.path.join(folder, f"async-{name}.jsonl")
        if not os.path.exists(path):
            continue
        rows = _rows(path)
        # vLLM's stats exist where it logged them (else an empty dict per request)
        hand = [(r["vllm"]["queued_ts"] - r["add"]) * 1e6 for r in rows
                if r["vllm"].get("queued_ts") is not None]
        back = [(r["chunks"][0][0] - r["vllm"]["first_token_ts"]) * 1e6 for r in rows
                if r["vllm"].get("first_token_ts") is not None]
        ttft = [(r["chunks"][0][0] - r["add"]) * 1e3 for r in rows]
        # each chunk is (receive time, tokens in that delta)
        tpot = [(r["chunks"][-1][0] - r["chunks"][0][0]) * 1e3
                / max(sum(c[1] for c in r["chunks"]) - 1, 1) for r in rows]
        real = {"ttft_ms": sum(ttft) / len(ttft), "tpot_ms": sum(tpot) / len(tpot)}
        out.append({"plan": name, "requests": len(rows),
                    # add -> engine-core queue: the client's add work plus the hand-off
                    "in_delay_us": {"p10": _pct(10, hand), "median": _pct(50, hand),
                                    "model": IN_PROCESS["in_us"] + IN_PROCESS["in_delay_us"]},
                    # first token sampled -> the caller has it (one output, no detokenising)
                    "out_path_us": {"median": _pct(50, back), "p90": _pct(90, back),
                                    "model": IN_PROCESS["out_us"] + IN_PROCESS["out_delay_us"]
                                    + IN_PROCESS["out_per_output_no_detok_us"]},
                    "real": real, "sim": simulated(name, rows, meta["model"])})
    for name in OFFLINE:
        path = os.path.join(folder, f"offline-{name}.json")
        if os.path.exists(path):
            with open(path) as f:
                d = json.load(f)
            out.append({"plan": f"offline-{name}", "requests": len(d["requests"]),
                        "wall_s": d["wall_s"]})
    return out


def format_summary(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        if "wall_s" in r:
            lines.append(f"{r['plan']}: {r['requests']} requests in {r['wall_s']:.2f} s")
            continue
        h, b, re_, si = r["in_delay_us"], r["out_path_us"], r["real"], r["sim"]
        lines.append(
            f"{r['plan']}: {r['requests']} requests; add -> queued p10 {h['p10']:.0f} µs, "
            f"median {h['median']:.0f} (IN_PROCESS in_us + in_delay_us {h['model']:.0f}); first "
            f"token -> client median {b['median']:.0f} µs, p90 {b['p90']:.0f} (IN_PROCESS "
            f"out_us + out_per_output_no_detok_us + out_delay_us {b['model']:.0f}); mean TTFT real "
            f"{re_['ttft_ms']:.2f} ms, sim {si['ttft_ms']:.2f} "
            f"({(si['ttft_ms'] / re_['ttft_ms'] - 1) * 100:+.1f} %); TPOT real "
            f"{re_['tpot_ms']:.2f}, sim {si['tpot_ms']:.2f} "
            f"({(si['tpot_ms'] / re_['tpot_ms'] - 1) * 100:+.1f} %)")
    return "\n".join(lines)


def synthetic_run(raw: str, n: int = 6) -> None:
    """A tiny folder in the layout the device run writes (times on one monotonic clock)."""
    os.makedirs(raw, exist_ok=True)
    for name, (plen, olen, _, rate) in list(PLANS.items())[:2]:
        with open(os.path.join(raw, f"async-{name}.jsonl"), "w") as f:
            for i in range(n):
                add = 50.0 + (i / rate if rate else 0.0)
                first = add + 0.012 + 0.001 * i
                chunks = [(first + 0.0002 + 0.006 * k, 1) for k in range(olen)]
                f.write(json.dumps({"i": i, "add": add, "chunks": chunks, "vllm": {
                    "arrival_time": add + 0.0002, "queued_ts": add + 0.004,
                    "scheduled_ts": add + 0.005, "first_token_ts": first,
                    "last_token_ts": chunks[-1][0] - 0.0002}}) + "\n")
    with open(os.path.join(raw, "offline-short.json"), "w") as f:
        json.dump({"start": 1.0, "wall_s": 2.5, "requests": [{"output": 16, "vllm": {}}] * n}, f)
    os.makedirs(os.path.join(raw, "probe"), exist_ok=True)
    with open(os.path.join(raw, "meta.json"), "w") as f:
        json.dump({"vllm": "dry-run", "model": "llama-3.1-8b", "plans": PLANS}, f)


# the calls that bring the vLLM payload (validation/vllm-h200/README.md), then this script
CALLS = ([[".vllm/p1"], [".vllm/p2"], [".vllm/p3"],
          [".vllm/p4", ".vllm/whl", ".vllm/whl2", ".vllm/whl3", ".vllm/stub"]])


def dry_run(budget_s: float = 540.0, engine_start_s: float = 150.0) -> int:
    import tempfile
    sys.path.insert(0, REPO)
    from simserve import device_check as D
    from simserve.realcheck import vllm_campaign as C
    probs = [f"vllm_campaign lacks {n}" for n in ("setup", "ENV", "ROOT", "SITE")
             if not hasattr(C, n)]
    # two engines start (AsyncLLM, then LLM); the async plans run twice (the first warms)
    need = 2 * engine_start_s + sum(n / r if r else 1.0 for _, _, n, r in PLANS.values()) + 8
    if need > budget_s:
        probs.append(f"plans need ~{need:.0f} s, budget {budget_s:.0f} s")
    if os.path.isdir(os.path.join(REPO, ".vllm", "p1")):
        tree = D.tree_bytes(REPO)
        for carry in CALLS:
            size = sum(D.folder_bytes(os.path.join(REPO, c)) for c in carry
                       if os.path.isdir(os.path.join(REPO, c)))
            probs += [p for c in carry for p in D.parts_problems(
                [os.path.join(REPO, c)], None, part_bytes=D.CARRY_BYTES)]
            if tree is not None and tree + size > D.CARRY_BYTES:
                probs.append(f"call carrying {' '.join(carry)}: {size} + tree {tree} bytes "
                             f"exceed {D.CARRY_BYTES}")
        print(f"payload: {len(CALLS)} calls checked")
    else:
        print("payload: .vllm not built (simserve/realcheck/vllm_payload/build.sh); "
              "parts not checked")
    with tempfile.TemporaryDirectory() as tmp:
        raw, out = os.path.join(tmp, "raw"), os.path.join(tmp, "OUT")
        synthetic_run(raw)
        probs += D.return_problems(os.path.dirname(D.pack(raw, out, "inprocess")))
        back = D.unpack(os.path.join(out, "inprocess.tar.xz"), os.path.join(tmp, "back"))
        rows = summarize(back)
        print(format_summary(rows))
        if len(rows) != 3:
            probs.append(f"summary read {len(rows)} plans of the synthetic run, expected 3")
        elif (abs(rows[0]["in_delay_us"]["median"] - 4000) > 1
              or abs(rows[0]["out_path_us"]["median"] - 200) > 1):
            probs.append("summary's hand-off / output path differ from the synthetic run's "
                         "4,000 / 200 µs")
    return D.report("inprocess_vllm", probs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--mode", choices=("async", "offline", "both"), default="both")
    ap.add_argument("--summarize", metavar="DIR", help="afterwards: score an unpacked run")
    ap.add_argument("--dry-run", action="store_true", help="check the plan here, no GPU")
    a = ap.parse_args(argv)
    if a.dry_run:
        return dry_run()
    if a.summarize:
        print(format_summary(summarize(a.summarize)))
        return 0
    if not a.out:
        ap.error("--out is required (or --summarize / --dry-run)")
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
