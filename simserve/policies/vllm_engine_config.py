"""Parameters of the chunked-prefill engines (`vllm`, `sarathi`, `chunked`) and vLLM's version
defaults."""
from __future__ import annotations

from dataclasses import dataclass

from simserve.policies.routing import check_router_options

# vLLM defaults by version (../shared/notes/hardware-and-models.md §5; vllm/engine/arg_utils.py):
# API-server token budget 8192 / 1024 seqs on >= 70 GiB GPUs that are not A100, else 2048 / 256;
# gpu_memory_utilization 0.90 up to v0.20, 0.92 from v0.21, when CUDA-graph memory is counted too.
# enable_prefix_caching: off by default in the V0 engine, on in V1, the default engine from
# v0.8.0 (vllm/engine/arg_utils.py: `enable_prefix_caching: Optional[bool] = None`, set True
# for V1 unless the model cannot use it).


def _version_tuple(v: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in str(v).lstrip("v").split(".")[:3])
    except ValueError:
        raise ValueError(f"vllm_version: expected a version like '0.22.1', got {v!r}") from None


@dataclass(frozen=True, slots=True)
class ChunkedConfig:
    """Parameters of `vllm` and `sarathi`. None means "the default of `vllm_version` on this
    GPU" (resolved in `resolve`). DualPace's baseline is vLLM 0.22.1, ConfluxServe's 0.15.1."""

    # token budget of one iteration (vLLM's --max-num-batched-tokens; decodes count 1 each,
    # a prefill chunk its tokens; for sarathi the paper's chunk size); None: vLLM's API-server
    # default, 8192 on GPUs of >= 70 GiB that are not A100, else 2048
    max_num_batched_tokens: int | None = None
    # most requests running at once (vLLM's --max-num-seqs); None: 1024 on GPUs of >= 70 GiB
    # that are not A100, else 256
    max_num_seqs: int | None = None
    # share of each GPU's HBM for weights, activations, CUDA graphs and KV (the rest is never
    # used); None: vLLM's default for `vllm_version`, 0.90 up to 0.20, 0.92 from 0.21
    gpu_memory_utilization: float | None = None
    block_size: int = 16  # tokens per KV block (vLLM's default on CUDA)
    # tensor-parallel degree of one engine; num_gpus / tp replicas run behind `router`
    tp: int = 1
    # iterations of at most `graph_max_tokens` tokens are priced as one CUDA-graph replay (the
    # profile's `graph_replay_us`), longer ones as eager launches; the KV budget also subtracts
    # vLLM's graph memory estimate (0.3 GiB, from 0.21 on). False: every iteration eager
    cuda_graphs: bool = True
    # iterations of at most this many tokens replay a CUDA graph; None = the GPU profile's
    # `graph_max_tokens` (vLLM's default capture sizes end at 512). The validation replay
    # sets it to cover every batch, as its executor graphs every iteration.
    graph_max_tokens: int | None = None
    # or "varlen": one FA2 varlen call over prefill + decodes; with engine: vllm on a profile
    # that timed vLLM's kernels, vLLM's own varlen call is used whatever this says
    mixed_attention: str = "split"
    # the vLLM release modelled: its defaults for the token budget, max_num_seqs,
    # gpu_memory_utilization (and whether graph memory is counted) and prefix caching, and the
    # measured host path `engine: vllm` uses (the profile's newest if this one was not measured)
    vllm_version: str = "0.22.1"
    # GiB per GPU held back for the activations of a profiling forward pass before the KV pool
    # is sized; None: estimated from the model's shapes at the token budget (kv_budget.py)
    activation_reserve_gib: float | None = None
    # KV blocks per engine, replacing the computed pool (vLLM's --num-gpu-blocks-override);
    # the validation replay sets the real server's count
    num_gpu_blocks_override: int | None = None
    leap: bool = True  # exact event leaping over decode-only steps; False steps one by one
    # the engine's host path (simserve/cost/host.py): "vllm" = vLLM's own (async scheduling
    # overlap, API-server front end, its kernels and their in-situ factor), measured on the
    # H200 and carried over to derived profiles; "ideal" = none (GPU forwards back to back,
    # no front end); "generic" = the profile's generic per-iteration overheads added to each
    # forward (what every policy without a measured engine pays, and what the real-executor
    # replay compares against); None (default) = "vllm" where it was measured on this very
    # GPU (h200-sxm), "generic" elsewhere, so paper comparisons on derived GPUs price every
    # design alike
    engine: str | None = None
    # vLLM's automatic prefix caching (sim/kv.py PrefixCachingBlockPool); None = the default
    # of `vllm_version` (on from v0.8, the V1 engine) for vllm/chunked, off for sarathi
    enable_prefix_caching: bool | None = None
    # vLLM's asynchronous scheduling (on by default since 0.12: the host prepares step n+1
    # while the GPU runs step n; `--no-async-scheduling` adds the two); None = as the
    # engine's measured host path says. Only read with engine: vllm.
    async_scheduling: bool | None = None
    # how requests reach the engine core (engine: vllm): True = vLLM's OpenAI API server
    # (`vllm serve`: HTTP, tokenising, streaming; its measured front end); False = an
    # in-process client (`AsyncLLM` / `LLM` in the caller's process: no HTTP front end, the
    # input and output processors and the hand-off to the engine core process remain,
    # simserve/cost/host.py IN_PROCESS); None = True, or False with `offline`
    api_server: bool | None = None
    # with api_server false: the client tokenises text prompts and detokenises outputs
    # (vLLM's SamplingParams.detokenize); false = token ids in and out
    detokenize: bool = True
    # the API server tokenises prompts that queued together in one call and hands them to the
    # engine core together (vLLM's AsyncMicrobatchTokenizer), with the admission costs
    # refitted around it (the profile's `frontend_batched`); off by default: on the held-out
    # real runs it does not beat the one-by-one front end (validation/vllm-h200/step_diff)
    tokenizer_batching: bool = False
    # vLLM's offline `LLM.generate` on a list: every request is added at t = 0 whatever the
    # workload's arrival times, through the in-process client; token times are when the
    # client's output processor handled them, and the call returns at the last finish
    offline: bool = False
    # how arrivals are spread over the num_gpus / tp replicas (simserve/policies/routing.py):
    # "least_outstanding" = the fewest requests held (running, waiting and in the front end),
    # the lowest index on ties; "round_robin" = in turn, whatever their load; "least_kv" = the
    # lowest share of KV blocks in use, then the fewest requests; "prefix_affinity" = the
    # replica that last served the longest prefix of the prompt (the trace's `hash_ids`, one
    # per 512 tokens), else consistent hashing with bounded loads, as the SGLang router's
    # cache-aware policy and llm-d's prefix scorer do (least_outstanding without `hash_ids`)
    router: str = "least_outstanding"
    # prefix_affinity: the fewest prompt blocks a remembered prefix must share to pin a
    # request to its replica, and the blocks hashed onto the ring otherwise
    affinity_blocks: int = 2
    # prefix_affinity: a replica holding more than this × the mean load (+1) is skipped for
    # the next one on the ring
    affinity_load_factor: float = 1.25

    def validate(self) -> None:
        _version_tuple(self.vllm_version)
        if self.engine not in (None, "vllm", "ideal", "generic"):
            raise ValueError(f"engine: expected 'vllm', 'ideal' or 'generic', got {self.engine!r}")
        for name in ("max_num_batched_tokens", "max_num_seqs", "num_gpu_blocks_override",
                     "graph_max_tokens"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        for name in ("block_size", "tp"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        if self.offline is True and self.api_server is True:
            raise ValueError("api_server: offline LLM.generate runs without the API server; "
                             "set api_server: false or leave it out")
        for name in ("detokenize", "offline", "tokenizer_batching"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected true or false, got {getattr(self, name)!r}")
        for name in ("enable_prefix_caching", "async_scheduling", "api_server"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, bool):
                raise ValueError(f"{name}: expected true or false, got {v!r}")
        u = self.gpu_memory_utilization
        if u is not None and not (0 < u <= 1):
            raise ValueError(f"gpu_memory_utilization: expected a number in (0, 1], got {u!r}")
        check_router_options(self.router, self.affinity_blocks, self.affinity_load_factor)

    def resolve(self, gpu_memory_gib: float, gpu_name: str) -> dict:
        big = gpu_memory_gib >= 70 and "a100" not in gpu_name
        ver = _version_tuple(self.vllm_version)
        return {
            "max_num_batched_tokens": self.max_num_batched_tokens or (8192 if big else 2048),
            "max_num_seqs": self.max_num_seqs or (1024 if big else 256),
            "gpu_memory_utilization": self.gpu_memory_utilization
            or (0.92 if ver >= (0, 21) else 0.90),
            "graphs_counted": ver >= (0, 21),
            "enable_prefix_caching": self.enable_prefix_caching
            if self.enable_prefix_caching is not None else ver >= (0, 8),
        }
