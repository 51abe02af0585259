"""Fit the API server's tokenizer batching stage (`frontend.batch_stage` of a GPU profile's
vLLM entry) from the real-vLLM probe logs, and say how well it predicts.

    python -m simserve.realcheck.tokenizer_fit [--root validation/vllm-h200] [--fit llama-default]
    python -m simserve.realcheck.tokenizer_fit --split   # the admission split around the stage

How vLLM's API server admits a completion request (read from vllm-project/vllm at commit
10f319bf, a main-branch snapshot of the 0.2x series; the probe's patch points match 0.22.1):
- `vllm/entrypoints/openai/completion/serving.py` (`OpenAIServingCompletion.create_completion`)
  parses and validates the request on the server's asyncio event loop, then renders the
  prompt through the renderer (`vllm/renderers/base.py`, `BaseRenderer.tokenize_prompt_async`,
  the call the probe times as `tokenize`), which awaits the renderer's one
  `AsyncMicrobatchTokenizer` (`BaseRenderer.get_async_tokenizer`);
- `AsyncMicrobatchTokenizer` (`vllm/utils/async_utils.py:24`, defaults at :35-36) keeps one asyncio queue per kind
  of call (encode / decode, by the encode keyword arguments) and one batcher task per queue
  (`_batch_encode_loop`): it waits for the first prompt, then keeps taking prompts for
  `batch_wait_timeout_s` (default 0.002 s) or until it holds `max_batch_size` (default 32),
  runs ONE tokenizer call over the whole list on a single-thread `ThreadPoolExecutor`
  (`run_in_executor`: the event loop stays free; a fast tokenizer's batch encode runs in
  Rust), and sets every request's future when it returns. Prompts that arrive while a call
  runs wait for the next batch, which again waits up to the timeout;
- each request then builds its engine request (`InputProcessor.process_inputs`), registers
  with the output processor and is sent to the engine-core process over ZMQ
  (`vllm/v1/engine/async_llm.py`, `AsyncLLM.add_request`); the engine core takes it from its
  input queue between steps (vLLM's `queued` timestamp).

What the probe measured (`probe/frontend-*`: each request's `tokenize_prompt_async` start
`t0`, end `t1` and token count; `probe/requests-*`: vLLM's `queued` time; the client's send):
- the batches: requests whose `t1` lie within 0.5 ms of each other came back from one call
  (they resume one after another on the event loop); a batch's call began when the worker
  took its first prompt (that prompt's `t0`, or the previous batch's end when it had waited)
  plus the gathering timeout, or at once for a full batch;
- per batch: its size, total prompt tokens and call time (end - start), fitted as
  `call_us + call_per_token_us · tokens` (robust, soft-L1), with the residuals;
- around it, per request: `send -> t0` (HTTP, parsing, validation: the admission work before
  the stage) and `t1 -> queued` (input processing and the hand-off; its low percentile is the
  hand-off, the rest waits for the engine core's step).
"""
from __future__ import annotations

import argparse
import glob
import json
import lzma
import os

import numpy as np

from simserve.realcheck.serve_score import ROOT

# vLLM 0.22.1 AsyncMicrobatchTokenizer's defaults (vllm/utils/async_utils.py), not fitted
WINDOW_US = 2000.0
MAX_SIZE = 32
SAME_CALL_S = 0.5e-3   # tokenisations returning this close together came from one call


def tokenize_rows(server_dir: str) -> list[dict]:
    """The probe's `tokenize` rows of one server, by end time."""
    rows = [json.loads(x) for f in sorted(glob.glob(os.path.join(
        server_dir, "probe", "frontend-*.jsonl.xz"))) for x in lzma.open(f, "rt")]
    return sorted((r for r in rows if r["call"] == "tokenize"), key=lambda r: r["t1"])


def calls(rows: list[dict]) -> np.ndarray:
    """Per tokenizer call: (size, prompt tokens, call seconds, start). A call starts when the
    worker took its first prompt plus the gathering window, or at once when full."""
    groups: list[list[dict]] = []
    for r in rows:
        if groups and r["t1"] - groups[-1][-1]["t1"] < SAME_CALL_S:
            groups[-1].append(r)
        else:
            groups.append([r])
    out, prev_end = [], -np.inf
    for g in groups:
        take = max(min(r["t0"] for r in g), prev_end)
        start = take if len(g) >= MAX_SIZE else take + WINDOW_US * 1e-6
        end = min(r["t1"] for r in g)
        out.append((len(g), sum(r["n"] or 0 for r in g), end - start, start))
        prev_end = max(r["t1"] for r in g)
    return np.asarray(out, dtype=np.float64)


def fit_call(c: np.ndarray) -> tuple[float, float, np.ndarray]:
    """`call_us`, `call_per_token_us` and the residuals (µs) over the calls `c`."""
    from scipy.optimize import least_squares
    X = np.column_stack([np.ones(len(c)), c[:, 1]])
    y = c[:, 2] * 1e6
    f = least_squares(lambda p: X @ p - y, x0=[1000.0, 2.0], loss="soft_l1", f_scale=500.0)
    return float(f.x[0]), float(f.x[1]), X @ f.x - y


def around(root: str, server: str) -> tuple[np.ndarray, np.ndarray]:
    """Per request of `server`'s runs (Mooncake excluded: its prompts are truncated, so the
    probe's counts do not match the client's): `send -> t0` and `t1 -> queued`, seconds,
    pairing the tokenize rows in start order with the sends in send order."""
    pre, post = [], []
    for _, send, t0, t1, q in paired(root, server):
        pre += list(t0 - send)
        post += list(q - t1)
    return np.asarray(pre), np.asarray(post)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=ROOT)
    ap.add_argument("--fit", default="llama-default", help="the server fitted on")
    ap.add_argument("--check", nargs="*", default=["qwen-default", "llama-rerun"],
                    help="servers the fit is checked on")
    ap.add_argument("--split", action="store_true",
                    help="measure the admission split around the stage (`split_costs`), "
                         "search only the hand-off (`in_delay_us`) on the --fit server")
    ap.add_argument("--search", action="store_true",
                    help="then refit the admission work around the stage (`in_us`, "
                         "`in_per_token_us`, `in_delay_us`) by replaying the --fit server's runs")
    a = ap.parse_args(argv)
    c = calls(tokenize_rows(os.path.join(a.root, a.fit)))
    call_us, per_tok, res = fit_call(c)
    q = np.percentile(np.abs(res), [50, 90])
    print(f"{a.fit}: {len(c)} tokenizer calls ({int(c[:, 0].sum())} prompts, "
          f"{100 * (c[:, 0] > 1).mean():.1f} % of calls batched, largest {int(c[:, 0].max())}); "
          f"call = {call_us:.0f} us + {per_tok:.3f} us/token; |residual| median {q[0]:.0f} us, "
          f"P90 {q[1]:.0f} us")
    for n in (1, 2, 4, 8, 16, 32):
        m = c[:, 0] == n
        if m.any():
            print(f"  size {n:2d}: {int(m.sum()):5d} calls, median {np.median(c[m, 1]):7.0f} tokens, "
                  f"measured {np.median(c[m, 2]) * 1e3:6.2f} ms, fitted "
                  f"{(call_us + per_tok * np.median(c[m, 1])) / 1e3:6.2f} ms")
    for s in a.check:
        d = os.path.join(a.root, s)
        if not glob.glob(os.path.join(d, "probe", "frontend-*.jsonl.xz")):
            continue
        k = calls(tokenize_rows(d))
        pred = call_us + per_tok * k[:, 1]
        err = np.abs(pred - k[:, 2] * 1e6)
        print(f"check {s}: {len(k)} calls, |error| median {np.median(err):.0f} us, "
              f"P90 {np.percentile(err, 90):.0f} us")
    pre, post = around(a.root, a.fit)
    if len(pre):
        print(f"around the stage ({a.fit}, {len(pre)} requests): send->tokenize "
              f"P10/50/90 {np.percentile(pre, [10, 50, 90]).round(4) * 1e3} ms; "
              f"tokenized->queued P10/50/90 {np.percentile(post, [10, 50, 90]).round(4) * 1e3} ms")
    stage = {"window_us": WINDOW_US, "max_size": MAX_SIZE, "call_us": round(call_us, -1),
             "call_per_token_us": round(per_tok, 2)}
    if a.split:
        fe = split_search(a.root, a.fit, stage)
        print("    frontend (split): " + json.dumps(fe))
    elif a.search:
        fe = search(a.root, a.fit, stage)
        print("    frontend: " + json.dumps(fe))
    else:
        print("    batch_stage: " + json.dumps(stage))
    return 0


# the admission work around the stage, searched over (µs)
GRID = {"in_us": [500.0, 1000.0, 2000.0, 3000.0, 4000.0], "in_per_token_us": [0.0, 0.8, 1.6],
        "in_delay_us": [4000.0, 6000.0, 8000.0, 10000.0]}


def search(root: str, server: str, stage: dict) -> dict:
    """The profile's front end with `stage` added, its admission costs re-searched on
    `server`'s runs (`host_fit.frontend_search`'s objective), the output costs kept."""
    from simserve.cost.host import engine_host
    from simserve.hardware.profile import load_profile
    from simserve.realcheck.host_fit import frontend_search
    host = engine_host(load_profile("h200-sxm"), "vllm")
    if host is None or not host.frontend:
        raise SystemExit("tokenizer_fit: h200-sxm has no measured vLLM front end to refit")
    fe = dict(host.frontend)
    fe["batch_stage"] = stage
    return frontend_search(root, fe, servers=(server,), grid=GRID)


# -- the admission split around the stage ---------------------------------------------------
def paired(root: str, server: str):
    """Per run of `server` whose tokenize rows pair one to one with its sends (Mooncake
    excluded, as in `around`): (run, sends, t0, t1, queued), seconds on the probe's clock,
    the sends sorted and each paired with the tokenize rows in start order."""
    from simserve.realcheck.serve_data import load_run, run_dirs
    from simserve.realcheck.step_diff import _probe, vllm_id
    sd = os.path.join(root, server)
    tk = sorted(tokenize_rows(sd), key=lambda r: r["t0"])
    _, by_id = _probe(sd)
    for d in run_dirs(root):
        if os.path.dirname(d) != sd or "mooncake" in d:
            continue
        run = load_run(d, os.path.join(root, "plans"))
        lo, hi = run.send.min() + run.origin - 1e-3, run.end.max() + run.origin
        rows = [r for r in tk if lo <= r["t0"] <= hi]
        if len(rows) != len(run.send):
            continue
        order = np.argsort(run.send, kind="stable")
        q = np.array([by_id[vllm_id(run.name, int(i))][1]["queued"] for i in order])
        yield (run, run.send[order] + run.origin, np.array([r["t0"] for r in rows]),
               np.array([r["t1"] for r in rows]), q)


def split_costs(root: str, server: str) -> dict:
    """The admission's parts around the stage, µs, from `server`'s logs:
    - `in_us`, the event-loop work before the tokenizer: in a burst with nothing streaming
      (no concurrency limit, every request sent at once) the last tokenize start minus the
      first send, per request;
    - `pre_delay_us`, the rest of the send -> tokenize-start time at any load: its median
      over the paced runs minus `in_us`;
    - `post_us`, the work after the tokenizer (input processing, registering, the send to the
      engine core): on the closed-loop runs, where a released batch meets an idle engine core
      that then runs a step with only part of it, that part's first `queued` after the
      call's end, per request of the part (an upper bound: it includes the hand-off)."""
    burst, paced, post = [], [], []
    for run, send, t0, t1, q in paired(root, server):
        rinf = "rinf" in run.name
        if rinf and run.max_concurrency is None:
            burst.append((t0.max() - send.min()) / len(send))
        elif not rinf:
            paced.append(t0 - send)
        if run.max_concurrency is not None:
            post += _post_per_request(t1, q)
    in_us = float(np.median(burst)) * 1e6 if burst else 0.0
    pre = float(np.median(np.concatenate(paced))) * 1e6 if paced else in_us
    return {"in_us": round(in_us, -1), "pre_delay_us": round(max(pre - in_us, 0.0), -1),
            "post_us": round(float(np.median(post)) * 1e6, -1) if post else 0.0,
            "n_burst": len(burst), "n_post": len(post)}



def _post_per_request(t1: np.ndarray, q: np.ndarray) -> list[float]:
    """Per tokenizer call of 4 or more prompts whose first engine-core drain took only part
    of it: (first `queued` - the call's end) / the part's size."""
    out, i, by = [], 0, np.argsort(t1, kind="stable")
    t1, q = t1[by], q[by]
    while i < len(t1):
        j = i
        while j + 1 < len(t1) and t1[j + 1] - t1[j] < SAME_CALL_S:
            j += 1
        m = j - i + 1
        if m >= 4:
            qs = np.sort(q[i:j + 1])
            k = int(np.sum(qs - qs[0] < SAME_CALL_S))
            if k < m and qs[0] > t1[i]:
                out.append((qs[0] - t1[i]) / k)
        i = j + 1
    return out


# the hand-off after the work past the stage (µs): the logs' `queued` also holds the wait for
# the engine core's next step, which the replay models, so it is searched
SPLIT_GRID = {"in_delay_us": [2000.0, 4000.0, 6000.0, 8000.0, 10000.0]}


def split_search(root: str, server: str, stage: dict) -> dict:
    """The profile's front end with `stage` and the admission split measured on `server`
    (`split_costs`; nothing per prompt token around the stage), the hand-off searched on
    `server`'s replays (`host_fit.frontend_search`), the output costs kept."""
    from simserve.cost.host import engine_host
    from simserve.hardware.profile import load_profile
    from simserve.realcheck.host_fit import frontend_search
    c = split_costs(root, server)
    print(f"split measured on {server}: {json.dumps(c)}")
    host = engine_host(load_profile("h200-sxm"), "vllm")
    if host is None or not host.frontend:
        raise SystemExit("tokenizer_fit: h200-sxm has no measured vLLM front end to refit")
    fe = dict(host.frontend, in_us=c["in_us"], in_per_token_us=0.0,
              pre_delay_us=c["pre_delay_us"], post_us=c["post_us"], batch_stage=stage)
    return frontend_search(root, fe, servers=(server,), grid=SPLIT_GRID)


if __name__ == "__main__":
    raise SystemExit(main())
