"""`simserve check-policy NAME`: run a registered policy (built-in or plugin) on a small workload
and check its token stream.

Every request must get exactly its output tokens, in time order, its first token at its
first-token time and its last at its finish time (no token lost, duplicated or out of order).
When the policy has a `leap` switch, the run with leaping is compared with the run stepped
one iteration at a time; when the hot modules run compiled, with the run from the Python
source. A difference names the first request and token (step) that differ.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from simserve.errors import ConfigError


def small_workload(n: int = 300, rate: float = 8.0, seed: int = 0):
    """n requests, Poisson arrivals at `rate`, prompts 16..4096 and outputs 1..512 tokens
    (log-uniform): short and long ones, bursts that queue and preempt."""
    from simserve.workload.spec import Workload
    rng = np.random.default_rng(seed)
    return Workload(np.cumsum(rng.exponential(1.0 / rate, n)),
                    np.exp(rng.uniform(np.log(16), np.log(4096), n)).astype(np.int64),
                    np.exp(rng.uniform(0, np.log(512), n)).astype(np.int64),
                    name=f"check-{n}")


def token_problems(rec) -> list[str]:
    """What is wrong with one run's token stream (empty: nothing)."""
    out = []
    counts = np.diff(rec.token_offsets)
    for i in np.flatnonzero(counts != rec.output_tokens)[:1]:
        out.append(f"request {i}: {counts[i]} tokens recorded for {rec.output_tokens[i]}")
    for i in range(rec.num_requests):
        t = rec.token_times(i)
        if np.isnan(t).any():
            out.append(f"request {i}: token {int(np.flatnonzero(np.isnan(t))[0])} never came")
        elif np.any(np.diff(t) < 0):
            out.append(f"request {i}: token {int(np.flatnonzero(np.diff(t) < 0)[0]) + 1} "
                       "came before the one ahead of it")
        elif len(t) and (t[0] != rec.first_token_s[i] or t[-1] != rec.finish_s[i]):
            out.append(f"request {i}: first/last token times differ from its first-token/"
                       "finish times")
        else:
            continue
        break
    return out


def first_difference(a, b) -> str | None:
    """Where two runs' token times first differ: the request and token with the earliest
    differing time, or None."""
    best = None
    for i in range(a.num_requests):
        x, y = a.token_times(i), b.token_times(i)
        if len(x) != len(y):
            return f"request {i}: {len(x)} vs {len(y)} tokens"
        d = np.flatnonzero(x != y)
        if len(d):
            j = int(d[0])
            t = min(x[j], y[j])
            if best is None or t < best[0]:
                best = (t, f"request {i}, token {j} (step at {x[j]!r} s vs {y[j]!r} s)")
    return None if best is None else best[1]


def _run(name: str, params: dict, model: str, hardware: dict, n: int, rate: float,
         trace: str | None):
    from simserve.hardware.setup import HardwareConfig
    from simserve.run import simulate_point
    from simserve.workload.build import load_trace
    w = load_trace(trace) if trace else small_workload(n, rate)
    return simulate_point(w, model, HardwareConfig(**hardware), name, **params).records


def check(name: str, params: dict, model: str = "llama-3.1-8b", hardware: dict | None = None,
          n: int = 300, rate: float = 8.0, trace: str | None = None,
          compiled: bool = True) -> list[str]:
    """Problems found (empty: the policy passes). `hardware`: `HardwareConfig` fields
    (default one H100)."""
    from simserve.policies import make_config
    cfg = make_config(name, params)
    args = (model, dict(hardware or {"gpu": "h100-sxm"}), n, rate, trace)
    try:
        leapt = _run(name, params, *args)
    except RuntimeError as exc:
        return [f"{name}: {exc}"]
    problems = [f"{name}: {p}" for p in token_problems(leapt)]
    if hasattr(cfg, "leap") and cfg.leap:
        try:
            stepped = _run(name, {**params, "leap": False}, *args)
        except RuntimeError as exc:
            return problems + [f"{name} stepped: {exc}"]
        problems += [f"{name} stepped: {p}" for p in token_problems(stepped)]
        d = first_difference(leapt, stepped)
        if d:
            problems.append(f"{name}: leaping and stepping differ first at {d}")
    if compiled and _runs_compiled():
        try:
            h = _source_hash(name, params, args)
        except subprocess.CalledProcessError as exc:
            last = (exc.stderr or "").strip().splitlines()[-1:] or ["no output"]
            return problems + [f"{name} from the Python source: {last[0]}"]
        if h != _hash(leapt):
            problems.append(f"{name}: the compiled modules and the Python source differ")
    return problems


def _hash(rec) -> str:
    import hashlib
    h = hashlib.sha256()
    for a in (rec.token_times_s, rec.num_preemptions, rec.first_token_s, rec.finish_s):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _runs_compiled() -> bool:
    from simserve import compiled
    return any(v == "compiled" for v in compiled.status().values())


def _source_hash(name: str, params: dict, args: tuple) -> str:
    code = ("import json, sys; from simserve import policy_check as C; a = json.loads(sys.argv[1]);"
            "print(C._hash(C._run(a[0], a[1], *a[2])))")
    env = dict(os.environ, SIMSERVE_PURE_PYTHON="1")
    out = subprocess.run([sys.executable, "-c", code, json.dumps([name, params, list(args)])],
                         env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def _params(pairs: list[str]) -> dict:
    import yaml
    out = {}
    for p in pairs or []:
        k, eq, v = p.partition("=")
        if not eq:
            raise ConfigError(f"--set {p}: expected KEY=VALUE")
        out[k.strip()] = yaml.safe_load(v)
    return out


def _check_flags(name: str, params: dict, hw: dict) -> None:
    """What the policy needs of the hardware, named as this command's flags (`--cpu`)."""
    from simserve.hardware.setup import HardwareConfig
    from simserve.policies import check_hardware, make_config
    try:
        check_hardware(make_config(name, params), HardwareConfig(**hw))
    except ConfigError as exc:
        flag = "--" + str(exc).split(":", 1)[0].removeprefix("hardware.").replace("_", "-")
        raise ConfigError(f"{flag}: policy {name} runs on the host CPU too; give {flag} "
                          "(e.g. --cpu xeon-silver-4510 --cpu-cores 12)") from None


def _main(a) -> int:
    try:
        hw = {k: v for k, v in (("gpu", a.gpu), ("num_gpus", a.num_gpus), ("cpu", a.cpu),
                                 ("cpu_cores", a.cpu_cores), ("pcie", a.pcie)) if v is not None}
        _check_flags(a.name, _params(a.set), hw)
        problems = check(a.name, _params(a.set), a.model, hw, a.n, a.rate, a.trace,
                         not a.no_compiled)
    except ConfigError as exc:
        print(f"simserve check-policy: {exc}", file=sys.stderr)
        return 2
    for p in problems:
        print(p)
    if not problems:
        from simserve.policies import make_config
        cfg = make_config(a.name, _params(a.set))
        leap = ("leaping = stepping" if getattr(cfg, "leap", False)
                else "no leap switch: stepped only")
        also = "; compiled = source" if not a.no_compiled and _runs_compiled() else ""
        print(f"{a.name}: every token once and in order; {leap}{also}")
    return 1 if problems else 0


def register(sub) -> None:
    p = sub.add_parser("check-policy", help="run a policy leap vs step (and compiled vs "
                                            "source) on a small workload; check its tokens")
    p.add_argument("name", help="a registered policy (simserve policies list)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="a policy parameter")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--gpu", default="h100-sxm")
    p.add_argument("--num-gpus", type=int, default=1)
    p.add_argument("--cpu", help="CPU profile (policies with a CPU tier: dualpace, neo)")
    p.add_argument("--cpu-cores", type=int)
    p.add_argument("--pcie", help="PCIe link profile (default: the GPU's)")
    p.add_argument("-n", type=int, default=300, help="requests (default 300)")
    p.add_argument("--rate", type=float, default=8.0, help="requests per second")
    p.add_argument("--trace", help="a trace file instead of the generated workload")
    p.add_argument("--no-compiled", action="store_true", help="skip compiled vs source")
    p.set_defaults(handler=_main)
