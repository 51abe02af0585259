"""Timestamps from inside a running vLLM (0.22.x V1): imported by a `sitecustomize` in every
process the server starts, when `SIMSERVE_PROBE_DIR` is set.

What it records, with `time.monotonic()` (one clock for every process on the host):
- engine core (one row per call): `schedule`, `execute_model`, `sample_tokens`,
  `update_from_output` and the whole `step` (schedule → launch → wait → update), each with the
  id of the batch it belongs to; per scheduled batch its composition (per request: tokens
  scheduled, tokens already computed, prompt length) and the GPU time between a CUDA event
  recorded before `execute_model` and one after `sample_tokens` on the same stream;
- front end (API server process): `process_outputs` (output processing + detokenisation of
  one engine-core output batch) with its size, prompt tokenisation calls, and per finished
  request vLLM's own timestamps (arrival, queued, scheduled, first and last token).

Nothing is written while requests are in flight: rows stay in memory and are written when the
engine (or the front end) has no unfinished request, so the probe adds list appends, not I/O
or serialisation, to the path it measures. It imports nothing from simserve or vLLM at module
import; patches are applied by a post-import hook when vLLM's modules load.
"""
from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable

_DIR = os.environ.get("SIMSERVE_PROBE_DIR", "")
_now = time.monotonic


class _Log:
    """Rows kept in memory, appended to `<dir>/<kind>-<pid>.jsonl` on `flush()`."""

    def __init__(self, kind: str):
        self.kind, self.rows = kind, []

    def flush(self, resolve=None) -> None:
        if not self.rows or not _DIR:
            return
        rows, self.rows = self.rows, []
        if resolve is not None:
            rows = resolve(rows)
        with open(os.path.join(_DIR, f"{self.kind}-{os.getpid()}.jsonl"), "a") as f:
            for r in rows:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")


STEPS, BATCHES, FRONT, REQS = _Log("calls"), _Log("batches"), _Log("frontend"), _Log("requests")


# -- engine core --------------------------------------------------------------------------
def _patch_engine_core(mod) -> None:
    EngineCore = mod.EngineCore
    orig_init = EngineCore.__init__

    def __init__(self, *a, **k):
        orig_init(self, *a, **k)
        try:
            _instrument_core(self)
        except Exception as exc:  # never break the engine for a probe
            print(f"[simserve probe] engine core not instrumented: {exc!r}", file=sys.stderr)

    EngineCore.__init__ = __init__


def _instrument_core(core) -> None:
    """Wrap this engine core's step and its scheduler's and executor's calls (rows above)."""
    import torch
    sched, ex = core.scheduler, core.model_executor
    ids: dict[int, int] = {}       # id(scheduler_output) -> batch number
    counter = [0]
    pending_ev: list = []           # (batch, start_event, end_event)
    prompt_len: dict[str, int] = {}

    o_schedule, o_update = sched.schedule, sched.update_from_output
    o_exec, o_sample = ex.execute_model, ex.sample_tokens
    o_step = core._process_engine_step
    cur = {"batch": None, "ev0": None}

    def schedule():
        t0 = _now()
        so = o_schedule()
        t1 = _now()
        b = counter[0]
        counter[0] += 1
        ids[id(so)] = b
        BATCHES.rows.append(_batch_row(so, b, t0, t1, sched, prompt_len))
        STEPS.rows.append(("schedule", b, t0, t1))
        cur["batch"] = b
        return so

    def execute_model(so, non_block=False):
        b = ids.get(id(so), -1)
        ev0 = torch.cuda.Event(enable_timing=True)
        ev0.record()
        cur["ev0"] = (b, ev0)
        t0 = _now()
        out = o_exec(so, non_block=non_block)
        STEPS.rows.append(("execute_model", b, t0, _now()))
        return out

    def sample_tokens(grammar_output, non_block=False):
        t0 = _now()
        out = o_sample(grammar_output, non_block=non_block)
        t1 = _now()
        if cur["ev0"] is not None:
            b, ev0 = cur["ev0"]
            ev1 = torch.cuda.Event(enable_timing=True)
            ev1.record()
            pending_ev.append((b, ev0, ev1))
            cur["ev0"] = None
            STEPS.rows.append(("sample_tokens", b, t0, t1))
        return out

    def update_from_output(so, model_output):
        t0 = _now()
        out = o_update(so, model_output)
        STEPS.rows.append(("update_from_output", ids.pop(id(so), -1), t0, _now(),
                           sum(len(v.outputs) for v in out.values()) if out else 0))
        return out

    def step():
        t0 = _now()
        executed = o_step()
        STEPS.rows.append(("step", cur["batch"], t0, _now()))
        if not (core.has_work() if hasattr(core, "has_work") else core.scheduler.has_requests()):
            flush()
        return executed

    sid = _short_ids()

    def flush():
        BATCHES.flush(lambda rows: _resolve_batches(rows, pending_ev, prompt_len, sid))
        STEPS.flush(lambda rows: [dict(zip(("call", "batch", "t0", "t1", "outputs"), r))
                                  for r in rows])
        for k in [k for k in prompt_len if k not in sched.requests]:
            del prompt_len[k]

    sched.schedule, sched.update_from_output = schedule, update_from_output
    ex.execute_model, ex.sample_tokens = execute_model, sample_tokens
    core._process_engine_step = step
    atexit.register(flush)
    _write_meta("engine", _engine_meta(core))


def _batch_row(so, b: int, t0: float, t1: float, sched, prompt_len: dict[str, int]) -> dict:
    """The row of scheduled batch `b` as the scheduler returned it (request ids still vLLM's;
    `_resolve_batches` shortens them); notes each new request's prompt length."""
    new = []
    for r in so.scheduled_new_reqs:
        n = len(r.prompt_token_ids) if r.prompt_token_ids is not None else -1
        prompt_len[r.req_id] = n
        new.append((r.req_id, n, r.num_computed_tokens))
    cr = so.scheduled_cached_reqs
    return {
        "batch": b, "t0": t0, "t1": t1, "tokens": so.total_num_scheduled_tokens,
        "sched": so.num_scheduled_tokens, "new": new,
        "cached_ids": cr.req_ids, "cached_computed": cr.num_computed_tokens,
        "resumed": len(cr.resumed_req_ids), "finished": len(so.finished_req_ids),
        "preempted": len(so.preempted_req_ids or ()),
        "waiting": len(sched.waiting), "running": len(sched.running)}


def _short_ids() -> Callable[[str], int]:
    """A function giving each request id a small int, in order of first sight (the files stay
    small)."""
    short: dict[str, int] = {}

    def sid(k: str) -> int:
        v = short.get(k)
        if v is None:
            v = short[k] = len(short)
        return v
    return sid


def _resolve_batches(rows: list, pending_ev: list, prompt_len: dict[str, int],
                     sid: Callable[[str], int]) -> list:
    """At a flush: each batch row's GPU time from its CUDA events (waits for the GPU; the
    events are then dropped), its requests as short ids, token counts and prompt lengths."""
    import torch
    torch.cuda.synchronize()
    gpu = {b: e0.elapsed_time(e1) for b, e0, e1 in pending_ev}
    pending_ev.clear()
    for r in rows:
        r["gpu_ms"] = gpu.get(r["batch"])
        sched = r.pop("sched")
        r["ids"] = [sid(k) for k in sched]
        r["n"] = list(sched.values())
        r["prompt_len"] = [prompt_len.get(k, -1) for k in sched]
        r["new"] = [(sid(k), n, c) for k, n, c in r["new"]]
        r["cached_ids"] = [sid(k) for k in r["cached_ids"]]
        r["cached_computed"] = list(r["cached_computed"])
    return rows


def _engine_meta(core) -> dict:
    """The engine's configuration, written once per engine core next to its rows."""
    cfg = core.vllm_config
    return {
        "async_scheduling": cfg.scheduler_config.async_scheduling,
        "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
        "max_num_seqs": cfg.scheduler_config.max_num_seqs,
        "enable_prefix_caching": cfg.cache_config.enable_prefix_caching,
        "num_gpu_blocks": cfg.cache_config.num_gpu_blocks,
        "block_size": cfg.cache_config.block_size,
        "cudagraph_mode": str(cfg.compilation_config.cudagraph_mode),
        "cudagraph_capture_sizes": list(cfg.compilation_config.cudagraph_capture_sizes or []),
        "max_cudagraph_capture_size": cfg.compilation_config.max_cudagraph_capture_size,
        "attention_backend": _attention_backend(core),
        "batch_queue_size": core.batch_queue_size,
    }


def _attention_backend(core) -> str | None:
    try:
        runner = core.model_executor.driver_worker.worker.model_runner
        groups = runner.attn_groups
        return ",".join(sorted({g.backend.get_name() for gs in groups for g in gs}))
    except Exception:  # noqa: BLE001 - informational only
        return None


# -- front end ----------------------------------------------------------------------------
def _patch_output_processor(mod) -> None:
    OP = mod.OutputProcessor
    orig = OP.process_outputs

    def process_outputs(self, engine_core_outputs, engine_core_timestamp=None,
                        iteration_stats=None):
        t0 = _now()
        out = orig(self, engine_core_outputs, engine_core_timestamp, iteration_stats)
        FRONT.rows.append(("process_outputs", t0, _now(), len(engine_core_outputs),
                           engine_core_timestamp))
        if self.get_num_unfinished_requests() == 0:
            _flush_front()
        return out

    OP.process_outputs = process_outputs


def _patch_stats(mod) -> None:
    IS = mod.IterationStats
    orig = IS.update_from_finished_request

    def update_from_finished_request(self, finish_reason, request_id, num_prompt_tokens,
                                     max_tokens_param, req_stats, num_cached_tokens=0):
        s = req_stats
        REQS.rows.append({"id": request_id, "arrival_wall": s.arrival_time,
                          "queued": s.queued_ts, "scheduled": s.scheduled_ts,
                          "first_token": s.first_token_ts, "last_token": s.last_token_ts,
                          "prompt": num_prompt_tokens, "cached": num_cached_tokens,
                          "generated": s.num_generation_tokens, "done_mono": _now(),
                          "done_wall": time.time()})
        return orig(self, finish_reason, request_id, num_prompt_tokens, max_tokens_param,
                    req_stats, num_cached_tokens)

    IS.update_from_finished_request = update_from_finished_request


def _patch_renderer(mod) -> None:
    R = getattr(mod, "BaseRenderer", None)
    if R is None or not hasattr(R, "tokenize_prompt_async"):
        return
    orig = R.tokenize_prompt_async

    async def tokenize_prompt_async(self, *a, **k):
        t0 = _now()
        out = await orig(self, *a, **k)
        n = None
        try:
            n = len(out["prompt_token_ids"])
        except Exception:  # noqa: BLE001
            pass
        FRONT.rows.append(("tokenize", t0, _now(), n, None))
        return out

    R.tokenize_prompt_async = tokenize_prompt_async


def _flush_front() -> None:
    FRONT.flush(lambda rows: [dict(zip(("call", "t0", "t1", "n", "engine_ts"), r))
                              for r in rows])
    REQS.flush()


def _write_meta(kind: str, d: dict) -> None:
    if _DIR:
        with open(os.path.join(_DIR, f"meta-{kind}-{os.getpid()}.json"), "w") as f:
            json.dump(d, f, indent=1, default=str)


# -- the post-import hook -------------------------------------------------------------------
_PATCHES = {
    "vllm.v1.engine.core": _patch_engine_core,
    "vllm.v1.engine.output_processor": _patch_output_processor,
    "vllm.v1.metrics.stats": _patch_stats,
    "vllm.renderers.base": _patch_renderer,
}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in _PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader, patch = spec.loader, _PATCHES[name]
        orig_exec = loader.exec_module

        def exec_module(module):
            orig_exec(module)
            try:
                patch(module)
            except Exception as exc:  # noqa: BLE001
                print(f"[simserve probe] {name} not patched: {exc!r}", file=sys.stderr)

        loader.exec_module = exec_module
        return spec


def install() -> None:
    """Install the hook once per process (from sitecustomize); a no-op without a probe dir."""
    if not _DIR or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    os.makedirs(_DIR, exist_ok=True)
    sys.meta_path.insert(0, _Finder())
    atexit.register(_flush_front)
