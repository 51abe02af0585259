"""`simserve regress DIR [--update]`: rerun small experiments and compare their curves and
sustainable rates with stored baselines.

DIR holds experiment YAMLs (a user's own folder of them works as it is), `baselines/NAME.json`
beside them (`--update` records them), and optionally `regress.yaml` (per-metric relative
tolerances and, per experiment, targets such as `p99_ttft_ms<=2000`; without it,
`DEFAULT_TOLERANCES` and no targets). `--junit-xml FILE` also writes the comparisons as JUnit
test cases, one per metric of each (experiment, policy) curve, so a CI system lists the curve
that moved. A point (policy,
rate, seed) changes when a metric moves by more than its tolerance, relative to the
baseline; a sustainable rate likewise (a censored rate must stay censored). Any change, better
or worse, fails: the simulator's behaviour moved and a person should look, then accept it with
`--update`, which rewrites the baselines and prints what changed.
"""
from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from simserve.errors import ConfigError, did_you_mean
from simserve.runner.config import load_experiment
from simserve.runner.point import run_experiment_config
from simserve.metrics import sustainable_rate
from simserve.paths import umask_mode

TARGET = re.compile(r"^\s*([a-z0-9_]+)\s*(<=|>=)\s*([0-9.eE+-]+)\s*$")


@dataclass
class Row:
    experiment: str
    what: str        # metric or "sustainable_rate[target]"
    where: str       # policy / rate / seed
    baseline: float
    now: float
    tol: float

    @property
    def rel(self) -> float:
        if self.baseline == self.now or (math.isnan(self.baseline) and math.isnan(self.now)):
            return 0.0
        if self.baseline == 0 or math.isnan(self.baseline) or math.isnan(self.now):
            return math.inf
        return (self.now - self.baseline) / abs(self.baseline)

    @property
    def changed(self) -> bool:
        return abs(self.rel) > self.tol


# without a regress.yaml: the headline metrics may move by 2 % (our choice: about the spread
# of a seed change at these sizes is larger, so baselines are compared seed for seed)
DEFAULT_TOLERANCES = {"mean_ttft_ms": 0.02, "p99_ttft_ms": 0.02, "mean_tpot_ms": 0.02,
                      "p99_itl_ms": 0.02, "mean_e2el_ms": 0.02, "output_throughput": 0.02,
                      "slo_attainment": 0.02, "request_goodput": 0.02, "sustainable_rate": 0.02}


def load_settings(folder: Path) -> dict:
    p = folder / "regress.yaml"
    if not p.exists():
        return {"tolerances": dict(DEFAULT_TOLERANCES), "targets": {}}
    try:
        d = yaml.safe_load(p.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: not readable YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{p}: expected a mapping with tolerances: and targets:")
    for k in d:
        if k not in ("tolerances", "targets"):
            raise ConfigError(f"{p}: unknown key {k!r}{did_you_mean(k, ['tolerances', 'targets'])}")
    tol = d.get("tolerances") or {}
    targets = d.get("targets") or {}
    if not isinstance(tol, dict) or not isinstance(targets, dict):
        raise ConfigError(f"{p}: tolerances and targets: expected mappings")
    for k, v in tol.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ConfigError(f"{p}: tolerances.{k}: expected a non-negative number, got {v!r}")
    for k, v in targets.items():
        if not isinstance(v, list):
            raise ConfigError(f"{p}: targets.{k}: expected a list, e.g. [p99_ttft_ms<=2000]")
        for t in v:
            parse_target(t, f"{p}: targets.{k}")
    return {"tolerances": tol, "targets": targets}


def parse_target(expr: str, where: str) -> tuple[str, str, float]:
    m = TARGET.match(str(expr))
    if not m:
        raise ConfigError(f"{where}: target {expr!r}: expected METRIC<=VALUE or METRIC>=VALUE")
    return m.group(1), m.group(2), float(m.group(3))


def measure(path: Path, targets: list[str]) -> dict:
    """Run one experiment; its per-point metrics and its sustainable rates per target."""
    cfg = load_experiment(path)
    recs = [r.summary for r in run_experiment_config(cfg, out=None, progress=False)]
    out = {"experiment": cfg.name, "config_hash": cfg.hash(), "points": recs, "sustainable": []}
    for pol in dict.fromkeys(r["policy"] for r in recs):
        mine = sorted((r for r in recs if r["policy"] == pol), key=lambda r: r["request_rate"])
        rates = sorted({r["request_rate"] for r in mine})
        for expr in targets:
            metric, op, value = parse_target(expr, f"{path.parent}/regress.yaml")
            vals = []
            for rate in rates:
                xs = [r[metric] for r in mine if r["request_rate"] == rate]
                vals.append(sum(xs) / len(xs))
            sign = 1.0 if op == "<=" else -1.0  # make every curve "should rise with rate"
            rate, censored = sustainable_rate(rates, [sign * v for v in vals], sign * value)
            out["sustainable"].append({"policy": pol, "target": expr, "rate": rate,
                                       "censored": censored})
    return out


def compare(base: dict, now: dict, tol: dict) -> list[Row]:
    rows: list[Row] = []
    key = lambda r: (r["policy"], r["request_rate"], r["seed"])
    old = {key(r): r for r in base["points"]}
    for r in now["points"]:
        b = old.get(key(r))
        where = f"{r['policy']} @ {r['request_rate']:g} req/s, seed {r['seed']}"
        if b is None:
            rows.append(Row(now["experiment"], "point (new)", where, math.nan, 0.0, 0.0))
            continue
        for metric, t in tol.items():
            if metric == "sustainable_rate" or metric not in r:
                continue
            rows.append(Row(now["experiment"], metric, where, float(b[metric]), float(r[metric]), t))
    olds = {(s["policy"], s["target"]): s for s in base.get("sustainable", [])}
    for s in now["sustainable"]:
        b = olds.get((s["policy"], s["target"]))
        where = s["policy"]
        what = f"sustainable_rate[{s['target']}]"
        if b is None:
            rows.append(Row(now["experiment"], what + " (new)", where, math.nan, s["rate"], 0.0))
            continue
        t = tol.get("sustainable_rate", 0.0)
        if bool(b["censored"]) != bool(s["censored"]):
            t = -1.0  # censoring changed: always a change
        rows.append(Row(now["experiment"], what, where, float(b["rate"]), float(s["rate"]), t))
    return rows


def format_rows(rows: list[Row], only_changed: bool = False) -> str:
    show = [r for r in rows if r.changed or not only_changed]
    if not show:
        return "(no differences beyond tolerance)"
    lines = [f"{'experiment':28} {'metric':44} {'where':32} {'baseline':>11} {'now':>11} "
             f"{'change':>8} {'tol':>5}"]
    for r in show:
        ch = "inf" if math.isinf(r.rel) else f"{r.rel * 100:+.2f}%"
        flag = "  CHANGED" if r.changed else ""
        lines.append(f"{r.experiment[:28]:28} {r.what[:44]:44} {r.where[:32]:32} "
                     f"{r.baseline:11.5g} {r.now:11.5g} {ch:>8} {max(r.tol, 0) * 100:4.0f}%{flag}")
    return "\n".join(lines)


def experiments(folder: Path) -> list[Path]:
    files = sorted(p for p in [*folder.glob("*.yaml"), *folder.glob("*.yml")]
                   if p.name not in ("regress.yaml", "regress.yml"))
    if not files:
        raise ConfigError(f"{folder}: no experiment YAMLs to regress")
    return files


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.fchmod(fd, umask_mode())  # mkstemp's 0600 would survive the rename
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def regress(folder: Path, update: bool = False, verbose: bool = False,
            junit: Path | None = None) -> tuple[str, bool]:
    """Returns the report and whether everything matched the baselines; `junit`: where to
    write the comparisons as a JUnit XML report."""
    settings = load_settings(folder)
    report, ok = [], True
    cases: list[tuple[str, list[Row], str | None]] = []  # experiment, rows, why none
    files = experiments(folder)
    for path in files:  # every file parses before anything runs
        load_experiment(path)
    if not (folder / "regress.yaml").exists():
        report.append(f"{folder}: no regress.yaml; default tolerances "
                      f"({', '.join(f'{k} {v:.0%}' for k, v in DEFAULT_TOLERANCES.items())})")
    for path in files:
        targets = settings["targets"].get(path.stem, [])
        now = measure(path, targets)
        bpath = folder / "baselines" / f"{path.stem}.json"
        if not bpath.exists():
            if not update:
                report.append(f"{path.name}: no baseline ({bpath}); run with --update to record one")
                cases.append((path.stem, [], f"no baseline {bpath}; run with --update"))
                ok = False
                continue
            write_json(bpath, now)
            report.append(f"{path.name}: baseline recorded ({len(now['points'])} points)")
            continue
        try:
            base = json.loads(bpath.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{bpath}: not a readable baseline ({exc}); rerun with --update "
                              "to record it again") from None
        rows = compare(base, now, settings["tolerances"])
        cases.append((path.stem, rows, None))
        changed = [r for r in rows if r.changed]
        rates = ", ".join(f"{s['policy']} {s['target']}: "
                          f"{'>=' if s['censored'] and not math.isnan(s['rate']) else ''}"
                          f"{s['rate']:.3g}" for s in now["sustainable"])
        head = (f"{path.name}: {len(now['points'])} points, {len(rows)} comparisons, "
                f"{len(changed)} changed; sustainable rates: {rates or 'none'}")
        report.append(head)
        if changed or verbose:
            report.append(format_rows(rows, only_changed=not verbose))
        if update and changed:
            write_json(bpath, now)
            report.append(f"  baseline {bpath} rewritten")
        ok = ok and (update or not changed)
    if junit is not None:
        from simserve.runner.junit import write_junit
        write_junit(junit, folder, cases)
    return "\n".join(report), ok
