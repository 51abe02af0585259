"""How far a simulated figure is from the real engine, said beside the figures simserve prints.

`simserve/data/accuracy/vllm-h200.yaml` holds the mean |error| of simserve's `vllm` engine
against real vLLM 0.22.1 on the H200 (`validation/vllm-h200`), per host path, as
`simserve.realcheck.serve_score` computes it (`python -m simserve.realcheck.accuracy_fit
--write` regenerates the file; `tests/test_real_vllm.py` fails when it no longer matches the
committed runs). This module sits below the runner and `realcheck` (it reads the file only).
`accuracy_lines(records)` turns a run table's records into one line per (policy, GPU, host
path): measured against real vLLM on this GPU, carried over from the GPU it was measured on,
or never measured (generic overheads; designs whose engines nobody here ran).
"""
from __future__ import annotations

import os

VLLM_LOOP = ("vllm", "sarathi", "chunked")   # the policies that run vLLM's engine loop
FILE = ("accuracy", "vllm-h200.yaml")
SHORT = (("mean_ttft_ms", "TTFT"), ("p99_ttft_ms", "P99 TTFT"), ("mean_tpot_ms", "TPOT"),
         ("p99_itl_ms", "P99 ITL"), ("output_throughput", "tok/s"))
CHECK = ("check on a GPU machine with vLLM: simserve validate serve --out DIR, then "
         "--score (validation/vllm-h200/README.md)")


def load() -> dict:
    import yaml

    from simserve.paths import data_dir
    with open(os.path.join(data_dir(FILE[0]), FILE[1])) as f:
        return yaml.safe_load(f)


def _errs(row: dict) -> str:
    return ", ".join(f"{label} {row['mean_abs_err_pct'][k]:.1f} %" for k, label in SHORT)


def accuracy_lines(records: list[dict]) -> list[str]:
    """One line per distinct (policy, GPU, engine option) of a run table's records."""
    from simserve.cost.host import engine_host
    from simserve.hardware.profile import load_profile
    from simserve.policies import ALIASES
    acc, out, seen = None, [], set()
    for r in records:
        name, gpu = r.get("policy_name") or r.get("policy"), r.get("gpu")
        name = ALIASES.get(str(name), name)  # a deprecated name runs its policy's engine
        opts = r.get("policy_options") or {}
        key = (name, gpu, opts.get("engine"))
        if key in seen or gpu is None:
            continue
        seen.add(key)
        acc = acc or load()
        where = f"{r.get('policy', name)} on {gpu}"
        if name not in VLLM_LOOP:
            out.append(f"accuracy: {where}: its paper's engine was never run here; GPU "
                       f"iterations are validated against simserve's own executor "
                       f"({acc['executor']}), the serving path is not")
            continue
        host = engine_host(load_profile(gpu), opts.get("engine"), opts.get("vllm_version"))
        ref, n = acc["engines"], acc["runs"]
        if host is None:
            out.append(f"accuracy: {where}: generic host overheads (engine: generic); against "
                       f"real vLLM on the {acc['gpu']} these gave {_errs(ref['generic'])} over "
                       f"{n} runs; engine: vllm prices vLLM's measured host path")
        elif host.ideal:
            out.append(f"accuracy: {where}: engine: ideal (GPU forwards only); against real "
                       f"vLLM on the {acc['gpu']}: {_errs(ref['ideal'])} over {n} runs")
        elif gpu == acc["profile"]:
            out.append(f"accuracy: {where}: against real vLLM {acc['version']} on this GPU, "
                       f"mean |error| over {n} runs: {_errs(ref['vllm'])} "
                       f"({acc['source']}); {CHECK}")
        else:
            out.append(f"accuracy: {where}: vLLM's host path carried over from "
                       f"{acc['profile']} (not validated on {gpu}; there: "
                       f"{_errs(ref['vllm'])}); {acc['published']}; {CHECK}")
    return out
