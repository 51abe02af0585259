"""Parameters of the `neo` policy (NEO, MLSys'25; notes/policies.md §1), with where each
default came from. Names follow NEO's engine config where it has one."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, slots=True)
class NeoConfig:
    NEEDS_HARDWARE: ClassVar[tuple[str, ...]] = ("cpu",)  # checked before a run

    # Budget of one iteration: rows (requests) and tokens (a prefill counts its whole prompt,
    # a decode 1). NEO's evaluation config for the 24 GB A10
    # (`evaluation/configs/config-a10-8b.json`): max_num_seqs 1024, max_num_batched_tokens 20480.
    # (NEO's CLI defaults are 512 / 3072.) Prompts are never chunked, so every prompt must fit.
    max_batch_size: int = 1024
    max_tokens_in_batch: int = 20480   # token budget of an iteration; every prompt must fit it
    # Host KV pool: NEO's `swap_space` (GB of pinned host memory for KV); 120 in the A10 config,
    # and DualPace's main setting (Fig. 11b compares 30 / 60 / 120 / 240 GiB).
    host_kv_gib: float = 120.0
    # GPU KV pool: (HBM × gpu_mem_util − weights − peak of a max-token prefill) / block bytes,
    # NEO's profiler (`profile_num_blocks`, default util 0.99). Overrides for tests/sweeps.
    gpu_memory_utilization: float = 0.99
    # GiB held back for a max-token prefill's activations before the GPU KV pool is sized;
    # None: estimated from the model's shapes
    activation_reserve_gib: float | None = None
    num_gpu_blocks_override: int | None = None     # GPU KV blocks, replacing the computed pool
    num_cpu_blocks_override: int | None = None     # host KV blocks, replacing host_kv_gib's
    block_size: int = 16                            # NEO's block size (A10 config)
    # Prefill-to-CPU stages a prompt's KV in an extra GPU KV layer, as NEO's evaluation server
    # runs it (`--extra-layer-for-cprf`): the computed GPU pool keeps L/(L+1) of its blocks.
    # False: the staging is not charged to GPU memory. (An override is taken as given; NEO's
    # GPU-only baseline, `use_cpu: false`, has no staging.)
    itm_layer: bool = True
    # Swap-in only while the GPU decodes' blocks stay under this share of the GPU pool
    # (`swap_in_thr = round(0.95·num_gpu_blocks)` in NEO's scheduler).
    swap_in_ratio: float = 0.95
    # Which performance model steers the round decisions: `table`, NEO's own
    # (`TablePerfPredictor`: tables profiled on NEO's grid from this hardware profile and
    # interpolated, `neo/table.py`), or `oracle` (a labelled what-if: the simulator's cost
    # models at each batch's exact shape). Simulated time comes from the cost models either way.
    predictor: str = "table"
    # NEO's GPU gating: a CPU decode runs only when its attention hides under the other
    # sub-batch's GPU work and the pipeline beats the GPU-only batch (`neo/mode.py`). False
    # (a what-if for `simserve explain`): every CPU decode runs in every iteration.
    gpu_gating: bool = True
    # The engine's host path: `swiftllm`, NEO's runtime as its code runs it (synchronous Python
    # per iteration, per request and per pipelined stage, no CUDA graphs;
    # `cost/swiftllm_host.py`), or `generic` (the profile's generic per-iteration overheads,
    # CUDA graphs per `cuda_graphs`, as before this model existed).
    host: str = "swiftllm"
    # Python launch work of one pipelined stage (µs); None: the torch calls counted in NEO's
    # stage times the profile's launch cost. NEO's own T_lnch (800) is a what-if.
    stage_launch_us: float | None = None
    # NEO's predictor constants (`perfpredictor.py`): the CPU-side launch time added to every
    # sub-batch that holds CPU decodes (0.8 ms, per layer), and the token width under which no
    # CPU-destined prefill is trimmed from a batch (`linr_S_threshold` = 128). They steer
    # decisions only; simulated time comes from the cost models and the host path.
    cpu_launch_ms: float = 0.8
    linr_s_threshold: int = 128  # tokens; below it no CPU-destined prefill is trimmed (above)
    tp: int = 1                 # GPU tensor parallelism (one NEO engine spans the TP group)
    use_cpu: bool = True        # False: NEO's `always_use_gpu` baseline (no CPU attention, no
                                # Prefill-to-CPU; swapped-out requests wait to be swapped in)
    cuda_graphs: bool = True    # host `generic` only: GPU-only iterations replay CUDA graphs up
                                # to the profile's size (SwiftLLM captures none)
    leap: bool = True           # exact event leaping over GPU-only decode steps

    def validate(self) -> None:
        for name in ("max_batch_size", "max_tokens_in_batch", "block_size", "tp",
                     "linr_s_threshold"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        for name in ("num_gpu_blocks_override", "num_cpu_blocks_override"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        if not isinstance(self.host_kv_gib, (int, float)) or self.host_kv_gib < 0:
            raise ValueError(f"host_kv_gib: expected a non-negative number, got {self.host_kv_gib!r}")
        u = self.gpu_memory_utilization
        if not isinstance(u, (int, float)) or not (0 < u <= 1):
            raise ValueError(f"gpu_memory_utilization: expected a number in (0, 1], got {u!r}")
        r = self.swap_in_ratio
        if not isinstance(r, (int, float)) or not (0 < r <= 1):
            raise ValueError(f"swap_in_ratio: expected a number in (0, 1], got {r!r}")
        if not isinstance(self.cpu_launch_ms, (int, float)) or self.cpu_launch_ms < 0:
            raise ValueError(f"cpu_launch_ms: expected a non-negative number, got {self.cpu_launch_ms!r}")
        a = self.activation_reserve_gib
        if a is not None and (not isinstance(a, (int, float)) or a < 0):
            raise ValueError(f"activation_reserve_gib: expected a non-negative number, got {a!r}")
        if self.predictor not in ("table", "oracle"):
            raise ValueError(f"predictor: expected 'table' or 'oracle', got {self.predictor!r}")
        if self.host not in ("swiftllm", "generic"):
            raise ValueError(f"host: expected 'swiftllm' or 'generic', got {self.host!r}")
        s = self.stage_launch_us
        if s is not None and (not isinstance(s, (int, float)) or isinstance(s, bool) or s < 0):
            raise ValueError(f"stage_launch_us: expected a non-negative number, got {s!r}")
        for name in ("use_cpu", "cuda_graphs", "leap", "gpu_gating", "itm_layer"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected true or false, got {getattr(self, name)!r}")
