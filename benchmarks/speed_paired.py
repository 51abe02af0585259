"""Paired speed check of two revisions, each run from its own wheel, interleaved A,B,A,B.

    python benchmarks/speed_paired.py REV_A REV_B [OUT] [--rounds 3] [--repeat 3]
        [--startup-repeat 5] [--scale 100000] [--only CASE ...] [--b-params CASE=JSON]
        [--work /tmp/speed-paired]

On a shared machine the load changes by the minute, so two figures taken at different times
do not compare; two builds run turn about, case by case, do. For each revision:

1. its tree (`git archive`) is unpacked under WORK/<sha>/src and built as its own wheel
   (`pip wheel --no-deps .`: each tree's own build, compiled modules included), installed
   with its dependencies in its own venv WORK/<sha>/venv (reused when already there);
2. `python -m simserve --version` must report every hot module compiled, and every timed
   process checks that `simserve` is imported from that venv, not from a checkout.

Then, from WORK (outside both checkouts), with `SIMSERVE_TRACE_DIR` at the traces and no
`PYTHONPATH` or other `SIMSERVE_*` setting inherited:

- start-up: `bench_startup.py`'s four commands as fresh processes, A and B alternating per
  repetition (median wall and CPU seconds of each side);
- loop: every `bench_loop.py` case (each revision's own copy of the file, run with that
  revision's `one()`: warm-up, then the median of --repeat in-process runs), --rounds rounds
  of A then B per case; per case the median over rounds of each side's CPU seconds, B/A, the
  load average, and a digest of the last run's results (sha256 of every request's token
  times, preemptions, first-token and finish times, then all and stepped iterations, as
  `result_digests.py loop` prints) -- `same` where both sides agree; `--b-params CASE=JSON`
  adds a row `CASE*` where B runs the case with those policy parameters added (B's setting
  that reproduces A's results, where B changed a default on purpose);
- scale: `bench_scale.py`'s `conv` case at --scale requests (0 skips it), A,B,A,B: process
  plus record-sink child CPU seconds, and the run's iterations, mean TTFT and p99 ITL as its
  digest (--scale-gpu runs it on another GPU profile).

The ratio compared against a bar is B/A of CPU seconds (wall seconds also count time spent
waiting for a core). Output goes to the terminal and to OUT
(default benchmarks/results/speed-paired-<date>.txt).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_FILES = ("bench_loop.py", "bench_startup.py", "bench_scale.py")
TRACES = Path(os.environ.get("SIMSERVE_TRACE_DIR", "/work/shared/traces"))


@dataclass
class Side:
    name: str      # the revision as given
    sha: str
    python: Path   # the venv's interpreter
    bench: Path    # this revision's benchmarks/ copied out of its tree
    version: str = ""


def sh(cmd: list[str], **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout.strip()


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SIMSERVE_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["SIMSERVE_TRACE_DIR"] = str(TRACES)
    return env


def resolve(rev: str) -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "-q", f"{rev}^{{commit}}"],
                         capture_output=True, text=True)
    if out.returncode:
        print(f"speed_paired.py: {rev!r} is not a commit of {ROOT}", file=sys.stderr)
        raise SystemExit(2)
    return out.stdout.strip()


def prepare(rev: str, work: Path, log) -> Side:
    """Unpack, build and install `rev` once under work/<sha>; check it runs compiled."""
    sha = resolve(rev)
    d = work / sha[:12]
    venv = d / "venv"
    if not (venv / ".ready").exists():
        shutil.rmtree(d, ignore_errors=True)
        (d / "src").mkdir(parents=True)
        archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", sha], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(d / "src")], stdin=archive.stdout, check=True)
        if archive.wait():
            raise SystemExit(f"git archive {sha} failed")
        t0 = time.perf_counter()
        sh([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(d / "dist"),
            str(d / "src")], env=clean_env())
        build_s = time.perf_counter() - t0
        sh([sys.executable, "-m", "venv", str(venv)])
        wheel = next((d / "dist").glob("simserve-*.whl"))
        sh([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
           env=clean_env())
        (venv / ".ready").write_text(f"{wheel.name} built in {build_s:.0f} s\n")
    bench = d / "bench" / "benchmarks"  # bench_*.py put their parent on sys.path: no simserve there
    bench.mkdir(parents=True, exist_ok=True)
    for f in BENCH_FILES:
        shutil.copy(d / "src" / "benchmarks" / f, bench / f)
    side = Side(rev, sha, venv / "bin" / "python", bench)
    side.version = sh([str(side.python), "-m", "simserve", "--version"], cwd=work, env=clean_env())
    log(f"# {rev} = {sha[:12]}: {side.version}; {(venv / '.ready').read_text().strip()}")
    n = side.version.rsplit("compiled modules: ", 1)[-1].rstrip(")").split("/")
    if len(n) != 2 or n[0] != n[1] or n[0] == "0":
        raise SystemExit(f"{rev}: not every hot module is compiled ({side.version})")
    return side


def record_digest(rec, iterations: int, stepped: int) -> str:
    import numpy as np
    h = hashlib.sha256()
    for a, t in ((rec.token_times_s, np.float64), (rec.num_preemptions, np.int64),
                 (rec.first_token_s, np.float64), (rec.finish_s, np.float64)):
        h.update(np.ascontiguousarray(a, dtype=t).tobytes())
    return f"{h.hexdigest()[:16]}/{iterations}/{stepped}"


def loop_one(bench: str, label: str, repeat: int, extra: dict | None = None) -> None:
    """Child mode: one bench_loop case with this interpreter's installed simserve (`extra`:
    policy parameters added to the case's)."""
    sys.path.insert(0, bench)
    import bench_loop as B
    if extra:
        policy, setting, params = B.CASES[label]
        B.CASES[label] = (policy, setting, {**params, **extra})
    import simserve
    import simserve.run as run
    if not Path(simserve.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()):
        raise SystemExit(f"simserve imported from {simserve.__file__}, not from {sys.prefix}")
    last = {}
    orig = run.simulate_point

    def keep(*a, **k):
        last["res"] = orig(*a, **k)
        return last["res"]
    run.simulate_point = keep  # one() imports it by name when called
    r = B.one(label, repeat)
    from simserve import compiled
    res = last["res"]
    r.update(digest=record_digest(res.records, r["iterations"], r["stepped"]),
             compiled=compiled.summary(), load=os.getloadavg()[0])
    print(json.dumps(r))


def scale_one(bench: str, n: int, gpu: str) -> None:
    """Child mode: bench_scale's conv case at n requests (on `gpu` instead of its H200s)."""
    sys.path.insert(0, bench)
    import bench_scale as S
    import simserve
    if not Path(simserve.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()):
        raise SystemExit(f"simserve imported from {simserve.__file__}, not from {sys.prefix}")
    if gpu:
        S.HARDWARE = {**S.HARDWARE, "gpu": gpu}
    print(json.dumps(S.one("conv", n, False)))


def child(side: Side, args: list[str], work: Path) -> dict:
    out = subprocess.run([str(side.python), str(work / "speed_paired.py"), *args], cwd=work,
                         env=clean_env(), capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{side.name} {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_loop(a: Side, b: Side, work: Path, rounds: int, repeat: int, only, b_params: dict,
             log) -> list:
    cases = [c for c in _cases(a) if c in _cases(b) and (not only or c in only)]
    runs = [(c, None) for c in cases]
    for c, extra in b_params.items():
        if c not in cases:
            raise SystemExit(f"--b-params: {c!r} is not a case of both revisions' bench_loop.py")
        runs.insert(runs.index((c, None)) + 1, (c, extra))
        log(f"# {c}*: B runs the case with policy parameters {json.dumps(extra)} added")
    log(f"## loop: bench_loop cases, {rounds} rounds of A then B, each a fresh process "
        f"(warm-up + median of {repeat} in-process runs); CPU s of each round, the medians, "
        f"B/A of the medians and the median of the rounds' B/A (paired)")
    log(f"{'case':21} {'A CPU s (rounds)':>24} {'B CPU s (rounds)':>24} {'A med':>6} {'B med':>6} "
        f"{'B/A':>6} {'paired':>6}  {'load':>9}  digest")
    rows = []
    for c, extra in runs:
        ra, rb = [], []
        tail = [json.dumps(extra)] if extra else []
        for _ in range(rounds):
            ra.append(child(a, ["--loop-one", str(a.bench), c, str(repeat)], work))
            rb.append(child(b, ["--loop-one", str(b.bench), c, str(repeat), *tail], work))
        c = c + "*" if extra else c
        ma = statistics.median(r["cpu_s"] for r in ra)
        mb = statistics.median(r["cpu_s"] for r in rb)
        loads = [r["load"] for r in ra + rb]
        da, db = {r["digest"] for r in ra}, {r["digest"] for r in rb}
        dig = ("same " + da.pop()) if da == db and len(da) == 1 else \
            f"DIFFER A {' '.join(sorted(da))} B {' '.join(sorted(db))}"
        row = dict(case=c, a=[r["cpu_s"] for r in ra], b=[r["cpu_s"] for r in rb], a_med=ma,
                   b_med=mb, ratio=mb / ma,
                   paired=statistics.median(y["cpu_s"] / x["cpu_s"] for x, y in zip(ra, rb)), load=(min(loads), max(loads)), digest=dig,
                   compiled=(ra[0]["compiled"], rb[0]["compiled"]))
        rows.append(row)
        log(f"{c:21} {_fmt(row['a']):>24} {_fmt(row['b']):>24} {ma:6.3f} {mb:6.3f} "
            f"{mb / ma:6.3f} {row['paired']:6.3f}  {row['load'][0]:4.1f}-{row['load'][1]:4.1f}  {dig}")
    return rows


def _fmt(xs) -> str:
    return " ".join(f"{x:.3f}" for x in xs)


def _cases(side: Side) -> list[str]:
    code = f"import sys; sys.path.insert(0, {str(side.bench)!r}); import bench_loop; " \
           "print(' '.join(bench_loop.CASES))"
    return sh([str(side.python), "-c", code], cwd=side.bench.parent.parent, env=clean_env()).split()


def timed(cmd: list[str], cwd: Path) -> tuple[float, float]:
    import resource
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=clean_env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def run_startup(a: Side, b: Side, work: Path, repeat: int, log) -> list:
    sys.path.insert(0, str(b.bench))
    from bench_startup import POINT  # the command line of the 2,000-request point
    sys.path.pop(0)
    cmds = [("python -c pass", ["-c", "pass"]), ('python -c "import simserve"',
            ["-c", "import simserve"]), ("python -m simserve --help", ["-m", "simserve", "--help"]),
            ("python -m simserve run (2,000-request point)", ["-m", "simserve", *POINT])]
    log(f"## start-up: bench_startup.py's commands, fresh processes from {work}, A and B "
        f"alternating, {repeat} each; median wall s / CPU s")
    log(f"{'command':46} {'A wall':>7} {'A CPU':>6} {'B wall':>7} {'B CPU':>6} {'B/A CPU':>7}  load")
    rows = []
    for label, argv in cmds:
        ta, tb = [], []
        for _ in range(repeat):
            ta.append(timed([str(a.python), *argv], work))
            tb.append(timed([str(b.python), *argv], work))
        ca, cb = (statistics.median(c for _, c in t) for t in (ta, tb))
        wa, wb = (statistics.median(w for w, _ in t) for t in (ta, tb))
        rows.append(dict(command=label, a_cpu=ca, b_cpu=cb, a_wall=wa, b_wall=wb, ratio=cb / ca))
        log(f"{label:46} {wa:7.3f} {ca:6.3f} {wb:7.3f} {cb:6.3f} {cb / ca:7.3f}  "
            f"{os.getloadavg()[0]:.2f}")
    return rows


def run_scale(a: Side, b: Side, work: Path, n: int, rounds: int, gpu: str, log) -> dict:
    log(f"## scale: bench_scale.py conv at {n:,} requests (vllm, 8 TP1 replicas on 8x "
        f"{gpu or 'H200'}, streamed records), {rounds} rounds of A then B; CPU s = process + "
        f"record-sink child")
    log(f"{'side':4} {'wall s':>7} {'CPU s':>7} {'child':>6} {'total':>7} {'peak MB':>8} "
        f"{'load':>9}  digest (iterations/mean TTFT ms/p99 ITL ms)")
    tot = {"A": [], "B": []}
    digs = {"A": set(), "B": set()}
    for _ in range(rounds):
        for key, s in (("A", a), ("B", b)):
            r = child(s, ["--scale-one", str(s.bench), str(n), gpu], work)
            t = r["cpu_s"] + r["child_cpu_s"]
            tot[key].append(t)
            d = f"{r['iterations']}/{r['mean_ttft_ms']:.6f}/{r['p99_itl_ms']:.6f}"
            digs[key].add(d)
            log(f"{key:4} {r['wall_s']:7.1f} {r['cpu_s']:7.1f} {r['child_cpu_s']:6.1f} {t:7.1f} "
                f"{r['peak_rss_mb']:8.0f} {r['load_before']:4.1f}-{r['load_after']:4.1f}  {d}")
    ma, mb = statistics.median(tot["A"]), statistics.median(tot["B"])
    same = "same" if digs["A"] == digs["B"] else "DIFFER"
    log(f"scale {n}: median total CPU s A {ma:.1f} B {mb:.1f}, B/A {mb / ma:.3f}; digests {same}")
    return dict(a=ma, b=mb, ratio=mb / ma, digest=same)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--loop-one":
        loop_one(sys.argv[2], sys.argv[3], int(sys.argv[4]),
                 json.loads(sys.argv[5]) if len(sys.argv) > 5 else None)
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--scale-one":
        scale_one(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev_a")
    ap.add_argument("rev_b")
    ap.add_argument("out", nargs="?", type=Path,
                    default=ROOT / f"benchmarks/results/speed-paired-{time.strftime('%Y%m%d')}.txt")
    ap.add_argument("--rounds", type=int, default=3, help="A,B rounds per loop case")
    ap.add_argument("--repeat", type=int, default=3, help="in-process runs per loop process")
    ap.add_argument("--startup-repeat", type=int, default=5, help="runs per start-up command "
                    "and side (0: skip)")
    ap.add_argument("--scale", type=int, default=100_000, help="requests of the scale point (0: skip)")
    ap.add_argument("--scale-rounds", type=int, default=2)
    ap.add_argument("--scale-gpu", default="", help="run the scale point on this GPU profile "
                    "instead of bench_scale's h200-sxm (e.g. one where both sides' results agree)")
    ap.add_argument("--only", nargs="+", help="only these bench_loop case labels")
    ap.add_argument("--b-params", action="append", default=[], metavar="CASE=JSON",
                    help="also run CASE with these policy parameters added on B's side (a row "
                         "CASE*), e.g. to time B's setting that reproduces A's results")
    ap.add_argument("--bar", type=float, default=0.15, help="allowed slow-down of B against A")
    ap.add_argument("--work", type=Path, default=Path("/tmp/speed-paired"))
    args = ap.parse_args()
    for rev in (args.rev_a, args.rev_b):
        resolve(rev)
    args.b_params = dict(_case_params(x) for x in args.b_params)
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as fh:
        def log(line: str) -> None:
            print(line, flush=True)
            fh.write(line + "\n")
            fh.flush()
        report(args, log)
    return 0


def _case_params(text: str) -> tuple[str, dict]:
    case, _, js = text.partition("=")
    try:
        params = json.loads(js)
    except json.JSONDecodeError as e:
        params = e
    if not case or not isinstance(params, dict):
        print(f"speed_paired.py: --b-params {text!r}: expected CASE={{JSON object}}",
              file=sys.stderr)
        raise SystemExit(2)
    return case, params


def report(args, log) -> None:
    t0 = time.perf_counter()
    log(f"# speed_paired.py {args.rev_a} (A) vs {args.rev_b} (B), "
        f"{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}, {os.cpu_count()} CPUs, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    a = prepare(args.rev_a, args.work, log)
    b = prepare(args.rev_b, args.work, log)
    shutil.copy(__file__, args.work / "speed_paired.py")
    up = run_startup(a, b, args.work, args.startup_repeat, log) if args.startup_repeat else []
    rows = run_loop(a, b, args.work, args.rounds, args.repeat, args.only, args.b_params, log)
    sc = run_scale(a, b, args.work, args.scale, args.scale_rounds, args.scale_gpu, log) \
        if args.scale else None
    log(f"# against the bar (B within {args.bar:.0%} of A, CPU s B/A <= {1 + args.bar:.2f}):")
    for r in up:
        log(f"#   start-up {r['command']:46} B/A {r['ratio']:.3f} "
            f"{'ok' if r['ratio'] <= 1 + args.bar else 'OVER'}")
    for r in rows:
        log(f"#   loop {r['case']:21} B/A {r['ratio']:.3f} "
            f"{'ok' if r['ratio'] <= 1 + args.bar else 'OVER'}  digests "
            f"{r['digest'].split()[0].lower()}")
    if sc:
        log(f"#   scale conv {args.scale:<7} {args.scale_gpu or 'h200-sxm':9} B/A {sc['ratio']:.3f} "
            f"{'ok' if sc['ratio'] <= 1 + args.bar else 'OVER'}  digests {sc['digest'].lower()}")
    log(f"# finished in {time.perf_counter() - t0:.0f} s, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    raise SystemExit(main())
