"""Device plan: SGLang 0.5.17's host path and step log on one H200, measured like vLLM's
(validation/vllm-h200/), for the SGLang-based baselines (MuxWise and its peers).

The payload (`benchmarks/sglang_payload/build.sh`, run here with network) is one xz tarball of
an unpacked site folder split into parts `.sglang/p1..pN` of <= 34 MB. On the device, back to
back (its /tmp survives only while the machine stays warm):
  calls 1..N-1, carry `.sglang/pK`:  mkdir -p /tmp/sg/parts && cp .sglang/pK/* /tmp/sg/parts/
  call N, carry `.sglang/pN .sglang/site.sha256`:
      cp .sglang/pN/* /tmp/sg/parts/ && python3 benchmarks/sglang_device_plan.py --step setup
      --out /tmp/sg/out && tar cJf $OUT/sglang-setup.tar.xz -C /tmp/sg/out .
  call N+1 (no carry):
      python3 benchmarks/sglang_device_plan.py --step run --out /tmp/sg/out --budget-s 480
      && tar cJf $OUT/sglang-run.tar.xz -C /tmp/sg/out .
`setup` checks the parts against the payload's sha256, unpacks them into /tmp/sg/site,
writes the model's config (dummy weights, no tokenizer) and imports SGLang's Engine path in a
child process, recording any module the trimmed payload lacks (`setup.json`). `run` starts
`sglang.Engine(load_format="dummy", skip_tokenizer_init=True)` for Llama-3.1-8B with the
probe below in the scheduler process, warms every shape, then replays plans of
`validation/vllm-h200/plans/` that the vLLM runs used through `async_generate` with token ids
and streaming, writing under --out:
- `steps-<pid>.jsonl`: per `Scheduler.run_batch`, its wall start/end (`time.monotonic()`),
  forward mode, per request its id (`<plan>-<i>`), tokens run this step, tokens computed
  before and prompt length, and the GPU time between CUDA events on the forward stream;
- `requests-<plan>.jsonl`: per request its send time and every streamed chunk's time;
- `meta.json`: versions and SGLang's resolved server arguments (chunked prefill size, max
  running requests, overlap schedule, CUDA-graph batch sizes, KV pool tokens).
Afterwards, here: unpack the tarball and run `python -m simserve.realcheck.sglang_steps DIR`.

    python3 benchmarks/sglang_device_plan.py --dry-run      # here: checks the plan, no GPU
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = "/tmp/sg"
SITE, PARTS = f"{ROOT}/site", f"{ROOT}/parts"
MODEL = "llama-3.1-8b"
# per model: the vLLM runs' plans at light, middle and near-knee load, and the `short` workload
PLANS_BY_MODEL = {
    "llama-3.1-8b": ("short-r100", "random-r6.2", "random-r15.5", "random-r24.8", "short-rinf"),
    "qwen3-14b": ("short-r100", "random-r3.3", "random-r8.3", "random-r13.4", "short-rinf")}
PLANS = tuple(f"{MODEL}-{p}" for p in PLANS_BY_MODEL[MODEL])


def plans_for(model: str) -> tuple[str, ...]:
    return tuple(f"{model}-{p}" for p in PLANS_BY_MODEL[model])


PLAN_KEYS = ("t", "p", "o")          # send time (s), prompt and output tokens
IMPORTS = ("sglang", "sglang.srt.entrypoints.engine", "sglang.srt.managers.scheduler",
           "sglang.srt.models.llama", "sglang.srt.layers.attention.flashattention_backend",
           "sgl_kernel", "flashinfer")


def step_row(t0, t1, gpu_ms, mode, reqs) -> dict:
    """One step's log row; `reqs` = [(rid, tokens this step, computed before, prompt)]."""
    return {"t0": t0, "t1": t1, "gpu_ms": gpu_ms, "mode": mode,
            "rids": [r[0] for r in reqs], "n": [r[1] for r in reqs],
            "computed": [r[2] for r in reqs], "prompt": [r[3] for r in reqs]}


def _batch_reqs(batch) -> list:
    """(rid, tokens, computed, prompt) of each request in an SGLang ScheduleBatch."""
    mode = batch.forward_mode
    ext = getattr(batch, "extend_lens", None)
    pre = getattr(batch, "prefix_lens", None)
    # a decode batch's lengths after `prepare_for_decode` (CPU copy, no sync); with the overlap
    # schedule a request's output_ids can lag one step behind, so they are the fallback only
    lens = getattr(batch, "seq_lens_cpu", None)
    lens = [int(x) for x in lens] if lens is not None and len(lens) == len(batch.reqs) else None
    out = []
    for k, r in enumerate(batch.reqs):
        prompt = len(r.origin_input_ids)
        if not mode.is_decode() and ext is not None and k < len(ext):
            out.append((r.rid, int(ext[k]), int(pre[k]), prompt))
        else:                                   # a decode: one token after all it has
            done = lens[k] - 1 if lens else prompt + len(r.output_ids) - 1
            out.append((r.rid, 1, done, prompt))
    return out


def _probe_scheduler(out_dir: str) -> None:
    """Wrap `Scheduler.run_batch` in the scheduler process. A step's row is written (one line,
    flushed) at the first later call that finds its CUDA events complete: no synchronisation
    is added to the loop, and only the run's last step or two can be left unwritten."""
    import torch
    from sglang.srt.managers import scheduler as S
    orig = S.Scheduler.run_batch
    log = open(os.path.join(out_dir, f"steps-{os.getpid()}.jsonl"), "a")
    pending: list = []

    def run_batch(self, batch, *args, **kw):
        stream = getattr(self, "forward_stream", None)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        reqs = _batch_reqs(batch)
        t0 = time.monotonic()
        e0.record(stream)
        res = orig(self, batch, *args, **kw)
        e1.record(stream)
        pending.append((t0, time.monotonic(), e0, e1, str(batch.forward_mode), reqs))
        done = 0
        while done < len(pending) and pending[done][3].query():
            done += 1
        if done:
            for a, b, x, y, mode, rq in pending[:done]:
                log.write(json.dumps(step_row(a, b, x.elapsed_time(y), mode, rq)) + "\n")
            log.flush()
            del pending[:done]
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
    d = f"{ROOT}/probe_site"
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "sitecustomize.py"), "w") as f:
        f.write(_HOOK.format(repo=REPO))
    return d


def load_plan(name: str) -> dict:
    path = os.path.join(REPO, "validation", "vllm-h200", "plans", name + ".json")
    with open(path) as f:
        plan = json.load(f)
    for k, r in enumerate(plan["requests"]):
        missing = [key for key in PLAN_KEYS if key not in r]
        if missing:
            raise ValueError(f"{path}: request {k} lacks {', '.join(missing)}")
    return plan


def prompt_ids(i: int, n: int) -> list[int]:
    return [1000 + (7 * i + k) % 30000 for k in range(n)]


async def _replay(engine, name: str, plan: dict, out_path: str) -> None:
    rows = []

    async def one(i: int, r: dict, t_start: float):
        await asyncio.sleep(max(0.0, t_start + r["t"] - time.monotonic()))
        send, chunks = time.monotonic(), []
        gen = await engine.async_generate(
            input_ids=prompt_ids(i, r["p"]), rid=f"{name}-{i}", stream=True,
            sampling_params={"max_new_tokens": r["o"], "ignore_eos": True, "temperature": 0})
        async for _ in gen:
            chunks.append(time.monotonic())
        rows.append({"i": i, "send": send, "chunks": chunks})

    t0 = time.monotonic() + 0.5
    await asyncio.gather(*(one(i, r, t0) for i, r in enumerate(plan["requests"])))
    with open(out_path, "w") as f:
        for r in sorted(rows, key=lambda r: r["i"]):
            f.write(json.dumps(r) + "\n")


def setup(out: str) -> int:
    """Unpack the payload parts (checked against their sha256) and import the Engine path."""
    parts = sorted(os.listdir(PARTS))
    h = hashlib.sha256()
    for p in parts:
        with open(os.path.join(PARTS, p), "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                h.update(block)
    with open(os.path.join(REPO, ".sglang", "site.sha256")) as f:
        want = f.read().split()[0]
    info = {"parts": parts, "sha256_ok": h.hexdigest() == want}
    if info["sha256_ok"]:
        os.makedirs(SITE, exist_ok=True)
        cat = " ".join(os.path.join(PARTS, p) for p in parts)
        subprocess.run(f"cat {cat} | xz -d -T0 | tar xf - -C {SITE}", shell=True, check=True)
        sys.path.insert(0, REPO)
        from simserve.realcheck.vllm_tokenizer import model_dir
        info["model_dirs"] = [model_dir(m, f"{ROOT}/models") for m in PLANS_BY_MODEL]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([SITE, REPO]))
        for mod in IMPORTS:
            r = subprocess.run([sys.executable, "-c", f"import {mod}"], env=env, text=True,
                               capture_output=True, timeout=300)
            info.setdefault("imports", {})[mod] = "ok" if r.returncode == 0 else r.stderr[-3000:]
    with open(os.path.join(out, "setup.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps({k: v for k, v in info.items() if k != "imports"}))
    print({m: ("ok" if v == "ok" else v.splitlines()[-1]) for m, v in info.get("imports", {}).items()})
    return 0 if info["sha256_ok"] else 1


def run(out: str, budget_s: float, model: str = MODEL) -> None:
    hook = _install_hook()
    sys.path[:0] = [SITE, REPO]
    os.environ.update(SIMSERVE_SGLANG_PROBE=out, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    os.environ["PYTHONPATH"] = os.pathsep.join([hook, SITE, REPO, os.environ.get("PYTHONPATH", "")])
    import sglang
    from simserve.realcheck.vllm_tokenizer import model_dir
    md = model_dir(model, f"{ROOT}/models")
    plans = plans_for(model)
    start = time.monotonic()
    loop = asyncio.new_event_loop()          # one loop: SGLang's tokenizer manager binds to it
    asyncio.set_event_loop(loop)
    engine = sglang.Engine(model_path=md, load_format="dummy", skip_tokenizer_init=True)
    with open(os.path.join(out, "meta.json"), "w") as f:
        import flashinfer
        import sgl_kernel
        import torch
        json.dump({"sglang": sglang.__version__, "sgl_kernel": sgl_kernel.__version__,
                   "flashinfer": flashinfer.__version__, "torch": torch.__version__,
                   "gpu": torch.cuda.get_device_name(0), "model": model, "plans": list(plans),
                   "engine_start_s": time.monotonic() - start, "clock": "time.monotonic",
                   "server_args": {k: str(v) for k, v in vars(engine.server_args).items()}},
                  f, indent=1)
    loop.run_until_complete(_replay(engine, "warmup", load_plan(plans[0]),
                                    os.path.join(ROOT, "warmup.jsonl")))
    for name in plans:
        plan = load_plan(name)
        if time.monotonic() - start + plan["requests"][-1]["t"] + 10 > budget_s:
            print(f"{name}: skipped, past the budget")
            continue
        loop.run_until_complete(_replay(engine, name, plan,
                                        os.path.join(out, f"requests-{name}.jsonl")))
    engine.shutdown()


# -- the dry run (here, no GPU) ---------------------------------------------------------------
class _Mode:
    def __init__(self, decode: bool):
        self.decode = decode

    def is_decode(self) -> bool:
        return self.decode

    def __str__(self) -> str:
        return "ForwardMode.DECODE" if self.decode else "ForwardMode.EXTEND"


class _Req:
    def __init__(self, rid: str, prompt: int, out: int):
        self.rid, self.origin_input_ids, self.output_ids = rid, [0] * prompt, [0] * out


class _Batch:
    def __init__(self, decode: bool, reqs: list, ext=None, pre=None):
        self.forward_mode, self.reqs = _Mode(decode), reqs
        self.extend_lens, self.prefix_lens = ext, pre


def synthetic_run(raw: str, plans=PLANS[:2], n: int = 4) -> None:
    """A tiny run in the layout `run` writes, its step rows made by the probe's own
    functions from stand-in batches: per plan, n requests prefilled together in one
    512-token chunk, then decoded for their outputs (3 tokens each)."""
    os.makedirs(raw, exist_ok=True)
    rows, t = [], 100.0
    for name in plans:
        reqs = [_Req(f"{name}-{i}", 128, 0) for i in range(n)]
        b = _Batch(False, reqs, ext=[128] * n, pre=[0] * n)
        rows.append(step_row(t, t + 0.0004, 9.0, str(b.forward_mode), _batch_reqs(b)))
        sends, chunks = [t - 0.002] * n, [[] for _ in range(n)]
        for k in range(3):
            t += 0.0095
            for i, r in enumerate(reqs):
                r.output_ids.append(0)
                chunks[i].append(t)
            b = _Batch(True, reqs)
            b.seq_lens_cpu = [128 + k + 1] * n
            rows.append(step_row(t, t + 0.0003, 6.0 + 0.1 * k, str(b.forward_mode),
                                 _batch_reqs(b)))
        with open(os.path.join(raw, f"requests-{name}.jsonl"), "w") as f:
            for i in range(n):
                f.write(json.dumps({"i": i, "send": sends[i], "chunks": chunks[i]}) + "\n")
        t += 1.0
    with open(os.path.join(raw, "steps-1.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(raw, "meta.json"), "w") as f:
        json.dump({"sglang": "dry-run", "model": MODEL, "plans": list(plans)}, f)


def dry_run(budget_s: float, engine_start_s: float = 150.0, payload: bool = True) -> int:
    """Everything checkable without a GPU: plans, their duration against the budget, the
    payload parts (where built), the probe's row layout, what comes back, and the reader."""
    import tempfile
    sys.path.insert(0, REPO)
    from simserve import device_check as D
    from simserve.realcheck import sglang_steps
    probs = []
    for model in PLANS_BY_MODEL:     # warm-up (the first plan again), then every plan
        total = engine_start_s
        for k, name in enumerate(plans_for(model)):
            try:
                total += (1 + (k == 0)) * (load_plan(name)["requests"][-1]["t"] + 2)
            except (OSError, ValueError, KeyError) as exc:
                probs.append(f"plan {name}: {exc}")
        if total > budget_s:
            probs.append(f"{model}: plans need ~{total:.0f} s (engine start assumed "
                         f"{engine_start_s:.0f} s), budget {budget_s:.0f} s")
    parts = sorted((d for d in os.listdir(os.path.join(REPO, ".sglang"))
                    if d[1:].isdigit()), key=lambda d: int(d[1:])) \
        if payload and os.path.isdir(os.path.join(REPO, ".sglang")) else []
    if parts:
        if not os.path.isfile(os.path.join(REPO, ".sglang", "site.sha256")):
            probs.append(".sglang/site.sha256 missing")
        probs += D.parts_problems([os.path.join(REPO, ".sglang", p) for p in parts],
                                  D.tree_bytes(REPO))
        print(f"payload: {len(parts)} parts: {len(parts)} back-to-back calls, the last "
              "running setup, then the run call")
    else:
        print("payload: not built (benchmarks/sglang_payload/build.sh); parts not checked")
    site = os.path.join(REPO, ".sglang", "site")
    if payload and os.path.isdir(site):   # what the Engine path imports, against payload and image
        sys.path.insert(0, os.path.join(REPO, "benchmarks", "sglang_payload"))
        import import_closure
        probs += [f"payload and image lack {t} (imported by {m})"
                  for t, m in sorted(import_closure.missing(site).items())]
    _HOOK.format(repo=REPO)
    with tempfile.TemporaryDirectory() as tmp:
        raw, out = os.path.join(tmp, "raw"), os.path.join(tmp, "OUT")
        synthetic_run(raw)
        probs += D.return_problems(os.path.dirname(D.pack(raw, out, "sglang-run")))
        back = D.unpack(os.path.join(out, "sglang-run.tar.xz"), os.path.join(tmp, "back"))
        if sglang_steps.main([back]) != 0:
            probs.append("simserve.realcheck.sglang_steps failed on the synthetic run")
    return D.report("sglang_device_plan", probs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step", choices=("setup", "run"))
    ap.add_argument("--out")
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--model", default=MODEL, choices=sorted(PLANS_BY_MODEL))
    ap.add_argument("--dry-run", action="store_true", help="check the plan here, no GPU")
    a = ap.parse_args(argv)
    if a.dry_run:
        return dry_run(a.budget_s)
    if not a.step or not a.out:
        ap.error("--step and --out are required (or --dry-run)")
    os.makedirs(a.out, exist_ok=True)
    if a.step == "setup":
        return setup(a.out)
    run(a.out, a.budget_s, a.model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
