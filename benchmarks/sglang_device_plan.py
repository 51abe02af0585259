"""Device plan: SGLang's host path and step log on one H200, measured like vLLM's
(validation/vllm-h200/), for the SGLang-based baselines (MuxWise and its peers). Not run yet:
no device was lent for it. Two calls of <= 10 minutes once the payload is on the machine.

Before the calls (here, with network): pick the SGLang release whose wheel pins the image's
torch (2.11.0+cu130; `pip download sglang==X --no-deps` and read its metadata), fetch it and
the kernels it imports on the serving path (`sgl-kernel`, `flashinfer-python` built for that
torch), trim and split them like `simserve/realcheck/vllm_payload/build.sh` (parts of <= 34 MB
beside the tree). Check every name patched below against that release's source: they are
from SGLang's `python/sglang/srt/managers/scheduler.py` (`Scheduler.run_batch`,
`process_batch_result`), `schedule_batch.py` (`ScheduleBatch.forward_mode`, `.reqs`,
`.extend_lens`, `.prefix_lens`) and `sglang/srt/entrypoints/engine.py` (`Engine`,
`async_generate`).

Call 1 (`--step setup`): unpack the payload into /tmp/site, write the config folders
(`simserve.realcheck.vllm_tokenizer.model_dir`: dummy weights, no tokenizer download),
import sglang once. Call 2 (`--step run`): start `sglang.Engine(load_format="dummy",
skip_tokenizer_init=True)` for Llama-3.1-8B with this probe in the scheduler process, warm
every shape, then replay the plans of `validation/vllm-h200/plans/` that the vLLM runs used
(random 1024/128 at three rates, `short` at 100 req/s and all at once) through
`async_generate` with token ids and streaming, writing under OUT:
- `steps-*.jsonl`: per `run_batch`, its wall start/end, forward mode (extend / decode /
  mixed), batch size, extend and prefix lengths, and the GPU time between CUDA events;
- `requests-<plan>.jsonl`: per request its send time and every streamed chunk's time;
- `meta.json`: versions, server arguments as SGLang resolved them (chunked prefill size,
  max running requests, overlap schedule, CUDA-graph batch sizes, KV pool tokens).
`python -m simserve.realcheck.step_diff` reads vLLM's probe layout; an SGLang reader for
`steps-*.jsonl` is the next step once data exists.

    python3 benchmarks/sglang_device_plan.py --step setup --out $OUT
    python3 benchmarks/sglang_device_plan.py --step run --out $OUT [--budget-s 540]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE = "/tmp/site"
PLANS = ("llama-3.1-8b-random-r6.2", "llama-3.1-8b-random-r15.5", "llama-3.1-8b-random-r24.8",
         "llama-3.1-8b-short-r100", "llama-3.1-8b-short-rinf")


def _probe_scheduler(out_dir: str) -> None:
    """Wrap `Scheduler.run_batch` in the scheduler process: composition, wall and GPU time."""
    import torch
    from sglang.srt.managers import scheduler as S
    orig = S.Scheduler.run_batch
    path = os.path.join(out_dir, f"steps-{os.getpid()}.jsonl")
    rows: list = []

    def run_batch(self, batch):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.monotonic()
        e0.record()
        res = orig(self, batch)
        e1.record()
        rows.append((t0, time.monotonic(), e0, e1, str(batch.forward_mode), len(batch.reqs),
                     list(getattr(batch, "extend_lens", None) or []),
                     list(getattr(batch, "prefix_lens", None) or [])))
        if len(rows) >= 256 or not self.running_batch:
            torch.cuda.synchronize()
            with open(path, "a") as f:
                for a, b, x, y, mode, n, ext, pre in rows:
                    f.write(json.dumps({"t0": a, "t1": b, "gpu_ms": x.elapsed_time(y),
                                        "mode": mode, "batch": n, "extend": ext,
                                        "prefix": pre}) + "\n")
            rows.clear()
        return res

    S.Scheduler.run_batch = run_batch


_HOOK = """import os, sys, importlib.abc, importlib.util
if os.environ.get("SIMSERVE_SGLANG_PROBE"):
    class _F(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != "sglang.srt.managers.scheduler":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module
            def exec_module(m):
                run(m)
                sys.path.insert(0, {repo!r})
                from benchmarks.sglang_device_plan import _probe_scheduler
                _probe_scheduler(os.environ["SIMSERVE_SGLANG_PROBE"])
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, _F())
"""


def _install_hook() -> str:
    """A sitecustomize that patches the scheduler in every process SGLang starts."""
    d = "/tmp/sgl_probe"
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "sitecustomize.py"), "w") as f:
        f.write(_HOOK.format(repo=REPO))
    return d


async def _replay(engine, plan: dict, out_path: str) -> None:
    rows = []

    async def one(i: int, r: dict, t_start: float):
        await asyncio.sleep(max(0.0, t_start + r["t"] - time.monotonic()))
        ids = [1000 + (7 * i + k) % 30000 for k in range(r["prompt"])]
        send, chunks = time.monotonic(), []
        gen = await engine.async_generate(input_ids=ids, stream=True, sampling_params={
            "max_new_tokens": r["output"], "ignore_eos": True, "temperature": 0})
        async for _ in gen:
            chunks.append(time.monotonic())
        rows.append({"i": i, "send": send, "chunks": chunks})

    t0 = time.monotonic() + 0.5
    await asyncio.gather(*(one(i, r, t0) for i, r in enumerate(plan["requests"])))
    with open(out_path, "w") as f:
        for r in sorted(rows, key=lambda r: r["i"]):
            f.write(json.dumps(r) + "\n")


def run(out: str, budget_s: float) -> None:
    hook = _install_hook()
    sys.path[:0] = [SITE, REPO]
    os.environ["SIMSERVE_SGLANG_PROBE"] = out
    os.environ["PYTHONPATH"] = os.pathsep.join([hook, SITE, REPO, os.environ.get("PYTHONPATH", "")])
    import sglang
    from simserve.realcheck.vllm_tokenizer import model_dir
    md = model_dir("llama-3.1-8b", "/tmp/vc/models")
    engine = sglang.Engine(model_path=md, load_format="dummy", skip_tokenizer_init=True)
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump({"sglang": sglang.__version__,
                   "server_args": {k: str(v) for k, v in vars(engine.server_args).items()}}, f,
                  indent=1)
    start = time.monotonic()
    for name in PLANS:
        if time.monotonic() - start > budget_s:
            break
        with open(os.path.join(REPO, "validation", "vllm-h200", "plans", name + ".json")) as f:
            plan = json.load(f)
        asyncio.run(_replay(engine, plan, os.path.join(out, f"requests-{name}.jsonl")))
    engine.shutdown()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step", choices=("setup", "run"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=540.0)
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    if a.step == "setup":
        raise SystemExit("setup: build the SGLang payload first (see this file's docstring); "
                         "the unpacking mirrors simserve.realcheck.vllm_campaign.setup")
    run(a.out, a.budget_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
