"""The host path of NEO's engine (SwiftLLM's Python runtime, NEO-MLSys25/NEO), per iteration,
per request and per pipeline stage, as NEO's code runs it. Not measured on a GPU here: the
structure is read from the code and the unit cost of a torch call is the profile's measured
eager launch cost (`overheads.launch_us_per_kernel`); every other constant is named below as
an assumption with the code it stands for. `benchmarks/neo_host_probe.py` is the device plan
that measures these unit costs on a GPU machine.

SwiftLLM's main loop (`swiftllm/server/engine.py::AsyncEngine._main_event_loop`) is
synchronous: `Scheduler.get_next_batch` → `BlockManager.prepare` → `do_one_iteration` (inputs,
forward, sampling that ends in `.tolist()`, a GPU sync) → `update_and_free`, one after the
other, so an iteration's host work adds to its forward (no asynchronous scheduling). It captures
no CUDA graphs: every layer launches its kernels from Python.

In a pipelined layer (`transformer_layer.py::_forward_pipeline_stage`) one Python thread
launches a stage's GPU work, waits for the other sub-batch's q/k/v (`qkvtr_e.synchronize()`),
runs the CPU attention (`torch.ops.pacpu.paged_attention_cpu`, blocking) and issues the copy
back; the GPU waits for that copy before the next stage (`_compute_wait_comm`). A stage
therefore lasts max(its GPU work, Python launch + CPU attention + activation copies).
"""
from __future__ import annotations

from dataclasses import dataclass

from simserve.cost.host import EngineHost

# torch calls SwiftLLM issues from Python, counted in NEO's source (one unit each):
ITER_CALLS = 22      # per iteration outside the layers: pre_layer embedding (2),
#                      post_layer.forward (6, ending in `.tolist()`), block_manager.py
#                      `BlockManager.alloc` / `_get_new_blk_ids` (≈10), `Swapper.set_block_tables` (4)
SUBBATCH_CALLS = 10  # per sub-batch: model.py `_prepare_inputs` (3 tensors from lists, positions,
#                      2 gathers, 2 zero buffers, cat, arange)
STAGE_CALLS = 21     # per pipelined stage: `_transfer_qkv` (4), `_postproj` (5), `_preproj` (7),
#                      `_attention` (flash-attn, 2 Triton paged-attention phases, copy, wait)
# Assumptions (not measured; CPython work counted in the code, at ≈0.1 µs a statement):
PER_SEQ_US = 5.0     # per request and iteration: scheduler.py `_get_next_batch_new` budget and
#                      block arithmetic, structs.py `SubBatch.add_*` / `set_model_forward_args`,
#                      the block manager's list comprehensions, `Request.update_output`
PER_TOKEN_US = 0.1   # per scheduled token: `_prepare_inputs` builds prompt positions as Python
#                      lists (`sum([list(range(prompt_len)) ...], [])`), `Request.get_input_tokens`
PER_CPU_QUEUE_US = 2.0  # per entry of the CPU decoding queue, every iteration: the loop of
#                      `Scheduler._decide_mode_and_gen_batch` (a length test, and for candidates
#                      a predictor lookup and two slacks)


@dataclass(frozen=True, slots=True)
class SwiftLLMHost:
    call_us: float           # one torch call from Python (the profile's eager launch cost)
    stage_us: float          # Python launch work of one pipelined stage

    @staticmethod
    def from_profile(gpu_profile, stage_us: float | None = None) -> SwiftLLMHost:
        """From the GPU profile's measured launch cost; `stage_us` overrides the counted stage
        (e.g. NEO's own T_lnch, 800 µs, as a what-if)."""
        call = float((gpu_profile.overheads or {}).get("launch_us_per_kernel", 0.0))
        return SwiftLLMHost(call, STAGE_CALLS * call if stage_us is None else float(stage_us))

    def engine_host(self) -> EngineHost:
        """The per-iteration host work of a one-sub-batch (GPU-only) iteration, for the GPU cost
        model: added to the forward (synchronous), no CUDA graphs."""
        return EngineHost("swiftllm", async_scheduling=False,
                          step_us=(ITER_CALLS + SUBBATCH_CALLS) * self.call_us,
                          step_per_seq_us=PER_SEQ_US, step_per_token_us=PER_TOKEN_US)

    def pipeline_extra_us(self) -> float:
        """A pipelined iteration's second sub-batch: its `_prepare_inputs` calls."""
        return SUBBATCH_CALLS * self.call_us

    def scan_us(self, cpu_queue: int) -> float:
        """The mode decision's loop over the CPU decoding queue (every iteration)."""
        return PER_CPU_QUEUE_US * cpu_queue
