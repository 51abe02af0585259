"""Reading and writing validation results (torch-free)."""
from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd

from simserve.metrics import request_frame
from simserve.realcheck.replay import compare

LOG_COLS = ["num_tokens", "num_prefills", "num_decodes", "decode_ctx_sum", "measured_us",
            "predicted_us"]


def save_replay(out: str, res: dict, info: dict) -> None:
    doc = {"info": info}
    for run in ("sim", "real"):
        if run not in res:
            continue
        r = res[run]
        # per-request results without the trace's own token counts (traces are not
        # redistributed with results)
        request_frame(r["records"]).drop(columns=["prompt_tokens", "output_tokens"]).to_csv(
            os.path.join(out, f"replay_{run}_requests.csv"), index=False)
        doc[run] = {"summary": r["summary"], "wall_s": r["wall_s"], "iterations": r["iterations"]}
        if "log" in r:
            pd.DataFrame(r["log"], columns=LOG_COLS).to_csv(
                os.path.join(out, "replay_real_iterations.csv"), index=False)
    if "real" in res:
        doc["comparison"] = compare(res["sim"]["summary"], res["real"]["summary"])
    with open(os.path.join(out, "replay.json"), "w") as f:
        json.dump(doc, f, indent=1, default=float)


def load_gpu_points(path: str) -> list[dict]:
    df = pd.read_csv(path)
    out = []
    for r in df.itertuples(index=False):
        out.append({"i": int(r.i), "kind": r.kind, "chunks": json.loads(r.chunks),
                    "chunk_ctx": json.loads(r.chunk_ctx), "chunk_sample": json.loads(r.chunk_sample),
                    "decode_ctx": json.loads(r.decode_ctx), "graph_us": float(r.graph_us),
                    "queued_us": float(r.queued_us),
                    "eager_us": float(r.eager_us) if pd.notna(r.eager_us) else np.nan})
    return out
