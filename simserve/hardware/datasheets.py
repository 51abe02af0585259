"""Datasheet numbers behind the derived (roofline) profiles, each with its source.

Numbers are from `../shared/notes/hardware-and-models.md` (§2 GPUs, §3 CPUs, §4 links), which
cites the vendor pages and cross-checks. Efficiencies are assumptions stated with their reason;
`simserve calibrate` replaces all of this with measured tables.
"""
from __future__ import annotations

NOTES = "shared/notes/hardware-and-models.md"

GPUS: dict[str, dict] = {
    "h100-sxm": {
        "vendor_name": "NVIDIA H100 SXM5 80GB", "memory_gib": 79.2, "mem_bandwidth_gbps": 3350,
        "bf16_tflops": 989.4, "sms": 132, "l2_mb": 50, "pcie": "pcie5-x16", "nvlink": "nvlink4",
        "sources": ["https://www.nvidia.com/en-us/data-center/h100/",
                    "Hopper whitepaper (gtc22-whitepaper-hopper)", f"{NOTES} §2.1"],
    },
    "h200-sxm": {
        "vendor_name": "NVIDIA H200 SXM 141GB", "memory_gib": 140.4, "mem_bandwidth_gbps": 4800,
        "bf16_tflops": 989.4, "sms": 132, "l2_mb": 60, "pcie": "pcie5-x16", "nvlink": "nvlink4",
        "sources": ["https://www.nvidia.com/en-us/data-center/h200/",
                    "143,771 MiB visible, 132 SMs, 60 MB L2 read on the project's H200",
                    f"{NOTES} §2.1"],
    },
    "h20": {
        "vendor_name": "NVIDIA H20 96GB", "memory_gib": 95.6, "mem_bandwidth_gbps": 4000,
        "bf16_tflops": 148.0, "sms": 78, "l2_mb": 60, "pcie": "pcie5-x16", "nvlink": "nvlink4",
        "sources": ["no vendor datasheet; huggingface.co/hardware/h20 and press summaries",
                    f"{NOTES} §2.1 (non-vendor figures)"],
    },
    "rtx4090": {
        "vendor_name": "NVIDIA GeForce RTX 4090 24GB", "memory_gib": 24.0,
        "mem_bandwidth_gbps": 1008, "bf16_tflops": 165.2, "sms": 128, "l2_mb": 72,
        "pcie": "pcie4-x16", "nvlink": None,
        "sources": ["NVIDIA Ada Lovelace architecture whitepaper, appendix table",
                    "165.2 TFLOPS = BF16 with FP32 accumulate", f"{NOTES} §2.1"],
    },
}

# Roofline efficiencies for GPUs. Reasons:
#  gemm: 769-798 TFLOP/s measured on the project's H200 for an 8192^3 bf16 GEMM = 0.78-0.81 of 989.
#  memory: 4.3 TB/s device-to-device copy measured on the H200 = 0.90 of 4.8; weight-streaming
#          GEMV kernels typically reach less, so 0.85.
#  prefill attention: FlashAttention-class kernels reach roughly half of dense peak (assumed).
#  decode attention: paged attention reaches ~0.7 of HBM bandwidth (assumed).
GPU_EFFICIENCY = {"gemm": 0.78, "memory": 0.85, "prefill_attn": 0.50, "decode_attn": 0.70,
                  "kernel_floor_us": 2.0}

# Per-iteration host costs (assumed until calibrated): scheduler + input preparation + sampling
# sync per iteration, per sequence, and kernel launch when a step runs eagerly. vLLM V1 replays
# CUDA graphs for batches up to 512 tokens (capture sizes up to min(2*max_num_seqs, 512)).
GPU_OVERHEADS = {"iteration_us": 300.0, "per_seq_us": 1.0, "launch_us_per_kernel": 5.0,
                 "kernels_per_layer": 10, "graph_replay_us": 20.0, "graph_max_tokens": 512,
                 "source": "assumed; replaced by `simserve calibrate`"}

CPUS: dict[str, dict] = {
    "xeon-silver-4510": {
        "vendor_name": "Intel Xeon Silver 4510 (Sapphire Rapids silicon)", "cores": 12,
        "base_ghz": 2.4, "turbo_ghz": 4.1, "amx_bf16_flop_per_cycle_per_core": 1024,
        "dram_gbps_peak": 281.6, "l3_mb": 30,
        "sources": ["Intel ARK 236637", "8 ch DDR5-4400 -> 281.6 GB/s", f"{NOTES} §3"],
    },
    "xeon-8469c": {
        "vendor_name": "Intel Xeon Platinum 8469C (cloud SPR SKU), one socket", "cores": 48,
        "base_ghz": 2.0, "turbo_ghz": 3.8, "amx_bf16_flop_per_cycle_per_core": 1024,
        "dram_gbps_peak": 307.2, "l3_mb": None,
        "sources": ["public lscpu dumps (48 cores/socket, 3.8 GHz max)",
                    "base clock not published; 2.0 GHz assumed (SPR Platinum)",
                    "DDR5-4800 x 8 ch = 307.2 GB/s (SPR platform max, unverified for the SKU)",
                    f"{NOTES} §3"],
    },
    "xeon-emr": {
        "vendor_name": "Intel Xeon (Emerald Rapids class, AMX) host of the project's H200, 16 cores",
        "cores": 16, "base_ghz": 2.0, "turbo_ghz": 3.9, "amx_bf16_flop_per_cycle_per_core": 1024,
        "dram_gbps_peak": 358.4, "l3_mb": None,
        "sources": ["8592+/8580 class (5th Gen) per-core clocks", "DDR5-5600 x 8 ch = 358.4 GB/s "
                    "(socket peak; a 16-core VM share is uncertain)", f"{NOTES} §3"],
    },
}

# CPU efficiencies: LIA (ISCA'25) measured ~20 TFLOPS bf16 AMX GEMM on Sapphire Rapids, about
# 15-20% of nominal peak; STREAM-like bandwidth is typically 70-85% of DDR peak (notes §3.1).
# A few cores cannot saturate the socket: per-core streaming bandwidth on Sapphire/Emerald
# Rapids is roughly 10-15 GB/s (assumed, not measured here), so achievable bandwidth is
# min(memory x DRAM peak, cores x per_core_gbps).
CPU_EFFICIENCY = {"amx": 0.18, "memory": 0.70, "per_core_gbps": 12.0, "kernel_floor_us": 10.0}
CPU_OVERHEADS = {"iteration_us": 200.0, "per_seq_us": 2.0,
                 "source": "assumed; replaced by `simserve calibrate`"}

LINKS: dict[str, dict] = {
    "pcie4-x16": {
        "vendor_name": "PCIe 4.0 x16", "theoretical_gbps_per_dir": 31.5,
        "h2d_gbps": 25.0, "d2h_gbps": 25.0, "latency_us": 10.0,
        "sources": ["~25 GB/s pinned measured on A100 Gen4 (BaM issue #54)", f"{NOTES} §4"],
    },
    "pcie5-x16": {
        "vendor_name": "PCIe 5.0 x16", "theoretical_gbps_per_dir": 63.0,
        "h2d_gbps": 55.0, "d2h_gbps": 55.0, "latency_us": 10.0,
        "sources": ["~55 GB/s each way pinned, measured on the project's H200 host (2026-11-30)",
                    "nvbandwidth host_to_device_memcpy_ce example 55.6 GB/s", f"{NOTES} §4"],
    },
    "nvlink4": {
        "vendor_name": "NVLink 4 (18 links)", "theoretical_gbps_per_dir": 450.0,
        "p2p_gbps": 380.0, "latency_us": 8.0,
        # ring all-reduce bus bandwidth; NCCL's busbw on HGX H100 is close to the p2p rate
        "allreduce_busbw_gbps": 360.0, "alltoall_busbw_gbps": 340.0, "collective_latency_us": 8.0,
        "sources": ["NCCL issue #1264: H100 p2p 376-390 GB/s one way", f"{NOTES} §4",
                    "collective bus bandwidths and latencies assumed"],
    },
}
