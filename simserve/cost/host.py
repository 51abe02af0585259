"""The host path of a real serving engine, as fitted functions read from a GPU profile
(`overheads.engines.<name>`), and the idealised engine that has none.

A profile entry (fitted by `python -m simserve.realcheck.host_fit` from real-vLLM probes):

    engines:
      vllm-0.22.1:
        async_scheduling: true
        step_us: 2200.0              # engine-core host work per step: schedule, prepare
        step_per_seq_us: 15.0        #   inputs and launch, sample, update (+ per sequence
        step_per_token_us: 0.07      #   and per token scheduled)
        gpu_in_situ: {tokens: [...], factor: [...]}   # vLLM's forward / simserve's prediction
        attention: {MODEL: {prefill_attn, decode_attn, varlen_decode}}  # vLLM's FA3, timed
        frontend: {in_us, in_per_token_us, out_us, out_per_output_us, in_delay_us, out_delay_us}
        frontend_batched: {the same keys, batch_stage: {window_us, max_size, call_us,
                           call_per_token_us}}   # optional; used with tokenizer_batching
                           # (+ pre_delay_us, post_us, post_per_token_us, pre_interleave:
                           # the admission split around the stage, `sim.frontend`)
        host_calls: {full|piecewise|eager: {schedule_us, launch_us_per_layer, update_us}}
        source: ...

With asynchronous scheduling (vLLM's default since 0.12) the host prepares step n+1 while
the GPU runs step n, so a step lasts max(GPU forward, host work); without it the two add.
The front end (API server: HTTP, tokenising, output processing, detokenising, streaming)
is one CPU every request contends for: `simserve.sim.frontend.FrontEnd`. With
`tokenizer_batching: true` the engine uses `frontend_batched` instead (fitted by
`python -m simserve.realcheck.tokenizer_fit --search`): the prompts then pass a batching
worker, as vLLM's API server tokenises every prompt queued together in one call.

`engine: ideal` is the engine with no host path at all: GPU forwards back to back, tokens
delivered when sampled, requests seen when they arrive. `engine: generic` keeps the profile's
generic per-iteration overheads (`iteration_us`, `per_seq_us`), added to each forward.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

ENGINES = ("ideal", "vllm", "generic")
DEFAULT_VERSION = {"vllm": "vllm-0.22.1"}


@dataclass(frozen=True, slots=True)
class EngineHost:
    name: str
    async_scheduling: bool = True
    step_us: float = 0.0
    step_per_seq_us: float = 0.0
    step_per_token_us: float = 0.0
    gpu_tokens: tuple = ()
    gpu_factor: tuple = ()
    frontend: dict | None = None
    # the front end refitted with a batching stage (`frontend_batched` in the profile), used
    # instead of `frontend` when asked for (`with_batching`)
    frontend_batched: dict | None = None
    attention: dict | None = None  # model -> vLLM's own attention tables (TP1)
    capture_sizes: tuple = ()      # CUDA-graph batch sizes: a replay pads the batch to one
    # the async engine-core loop's host calls by how a step runs ("full": one CUDA graph,
    # decode only; "piecewise": a mixed batch within the capture sizes; "eager": beyond them):
    # {mode: {schedule_us, launch_us_per_layer, update_us}}. With all three the vLLM-family
    # runtime replays the loop (`policies/vllm_loop.py`); other engines take the piecewise sum
    # as a mixed step's lower bound
    host_calls: dict | None = None

    @property
    def ideal(self) -> bool:
        return self.name == "ideal"

    def gpu_factor_at(self, tokens: np.ndarray) -> np.ndarray:
        """The engine's measured forward time over simserve's kernel prediction, by tokens."""
        if not self.gpu_tokens:
            return np.ones(len(tokens))
        lx = np.log2(np.maximum(np.asarray(tokens, dtype=np.float64), 1.0))
        return np.interp(lx, np.log2(np.asarray(self.gpu_tokens, dtype=np.float64)),
                         np.asarray(self.gpu_factor, dtype=np.float64))

    def make_frontend(self):
        if not self.frontend:
            return None
        from simserve.sim.frontend import BatchStage, FrontEnd
        f = self.frontend
        b = f.get("batch_stage")
        stage = None if not b else BatchStage(
            float(b["window_us"]), int(b["max_size"]), float(b["call_us"]),
            float(b["call_per_token_us"]))
        return FrontEnd(float(f["in_us"]), float(f["in_per_token_us"]), float(f["out_us"]),
                        float(f["out_per_output_us"]), float(f.get("in_delay_us", 0.0)),
                        float(f.get("out_delay_us", 0.0)), stage=stage,
                        pre_delay_us=float(f.get("pre_delay_us", 0.0)),
                        post_us=float(f.get("post_us", 0.0)),
                        post_per_token_us=float(f.get("post_per_token_us", 0.0)),
                        pre_interleave=bool(f.get("pre_interleave", False)))


IDEAL = EngineHost("ideal")

# vLLM 0.22's in-process clients (`AsyncLLM`, `LLM`), modelled from its code: a request goes
# `AsyncLLM.add_request` -> `InputProcessor.process_inputs` (tokenising a text prompt) ->
# `OutputProcessor.add_request` -> the engine-core client (msgspec + ZMQ to the engine core
# process, as behind the API server); outputs come back over ZMQ to
# `OutputProcessor.process_outputs` (detokenising when asked) and, for `AsyncLLM`, into each
# request's asyncio queue. No HTTP server, JSON or SSE streaming. Costs in µs, each with its
# source (`EngineHost.frontend`'s keys):
IN_PROCESS = {
    # measured (probe, `requests-*`, vLLM's own arrival and queued timestamps on the default
    # servers): the floor of arrival -> engine-core queue, 3.3-4.7 ms across servers; the
    # same hand-off and input path as behind the API server, without HTTP
    "in_delay_us": 4000.0,
    # assumption, not measured: input processing, output-processor registration and the
    # ZMQ send on the client's thread, per request (vLLM 0.22 async_llm.py add_request);
    # the device plan benchmarks/inprocess_vllm.py measures it
    "in_us": 200.0,
    # tokenising: the API server's fitted per-token cost (same tokenizer path); 0 for token ids
    "in_per_token_us": 2.5,
    # measured (probe, `frontend-*`): `process_outputs` alone, 45 µs + 15 µs per output,
    # with detokenising (the API server's response building and streaming excluded)
    "out_us": 45.0, "out_per_output_us": 15.0,
    # assumption: without detokenising, `process_outputs` still builds each RequestOutput
    # and its stats; two thirds of the measured per-output cost, until measured
    "out_per_output_no_detok_us": 10.0,
    # assumption: the output handler puts outputs in the request's asyncio queue; the caller
    # reads them on the same event loop (no socket), ~0
    "out_delay_us": 0.0,
}


def with_batching(host: EngineHost | None, on: bool) -> EngineHost | None:
    """`host` with its batched front end (`frontend_batched`: the API server's tokenizer
    batching stage and the admission costs refitted around it) when `on`; unchanged when
    off. Raises ValueError when asked of an engine whose profile has none fitted."""
    if not on:
        return host
    if host is None or host.ideal or not host.frontend_batched:
        name = "this engine" if host is None else host.name
        raise ValueError(f"tokenizer_batching: {name} has no fitted batching stage "
                         "(overheads.engines.<name>.frontend_batched in the GPU profile)")
    return dataclasses.replace(host, frontend=dict(host.frontend_batched))


def client_host(host: EngineHost | None, api_server: bool | None, detokenize: bool,
                offline: bool = False) -> EngineHost | None:
    """`host` with its front end replaced by the in-process client's (`IN_PROCESS`) when
    requests do not come through the API server; unchanged otherwise (and for `ideal` and
    `generic`, which have no front end to replace)."""
    in_process = api_server is False or (api_server is None and offline)
    if host is None or host.ideal or not in_process or host.frontend is None:
        return host
    c = IN_PROCESS
    fe = {"in_us": c["in_us"], "in_per_token_us": c["in_per_token_us"] if detokenize else 0.0,
          "out_us": c["out_us"],
          "out_per_output_us": c["out_per_output_us"] if detokenize
          else c["out_per_output_no_detok_us"],
          "in_delay_us": c["in_delay_us"], "out_delay_us": c["out_delay_us"]}
    return dataclasses.replace(host, frontend=fe)


def engine_host(profile, engine: str | None, version: str | None = None) -> EngineHost | None:
    """The host path of `engine` on this GPU profile. `ideal` → none; `vllm` → the profile's
    `vllm-<version>` entry, else its newest vLLM version (a baseline pinned to an older vLLM,
    e.g. ConfluxServe's 0.15.1, gets 0.22.1's host path: the only one measured); a derived
    profile's entry is carried over from the measured GPU (`carried_from`: the same host CPU
    path, vLLM's attention tables rescaled by datasheet ratios; not validated there).
    None (a policy's default) → `vllm` only where it was measured on this very GPU, else the
    generic overheads: paper comparisons on derived GPUs then price every design alike.
    Returns None for `generic`, or when the profile has no such engine (the caller keeps the
    profile's generic overheads)."""
    if engine == "ideal":
        return IDEAL
    if engine == "generic":
        return None
    auto = engine is None          # a policy's default: only an engine measured on this GPU
    if auto:
        engine = "vllm"
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
    table = (profile.overheads or {}).get("engines") or {}
    if auto:   # a derived profile's entries are carried over from the measured GPU
        table = {k: v for k, v in table.items() if not v.get("carried_from")}
    if not table:
        return None
    want = f"{engine}-{version}" if version else DEFAULT_VERSION[engine]
    name = want if want in table else max(
        (k for k in table if k.startswith(engine + "-")),
        key=lambda k: tuple(int(x) for x in k.split("-", 1)[1].split(".") if x.isdigit()))
    m = table[name]
    g = m.get("gpu_in_situ") or {}
    return EngineHost(name=name, async_scheduling=bool(m.get("async_scheduling", True)),
                      step_us=float(m.get("step_us", 0.0)),
                      step_per_seq_us=float(m.get("step_per_seq_us", 0.0)),
                      step_per_token_us=float(m.get("step_per_token_us", 0.0)),
                      gpu_tokens=tuple(g.get("tokens", ())), gpu_factor=tuple(g.get("factor", ())),
                      frontend=m.get("frontend"), frontend_batched=m.get("frontend_batched"),
                      attention=m.get("attention"),
                      capture_sizes=tuple(int(x) for x in m.get("cudagraph_capture_sizes", ())),
                      host_calls=m.get("host_calls"))
