"""Run the real-vLLM measurement campaign on the GPU machine, in as many device calls as it
takes: each call runs steps until its time budget, remembers where it stopped
(`/tmp/vc/state.json`) and packs what it measured into `$OUT` (the machine keeps `/tmp` and
a server started in its own session only while it stays warm between back-to-back calls).

    python3 -m simserve.realcheck.vllm_campaign --campaign FILE --out $OUT [--budget-s 540]

Steps (a campaign is a JSON list of them):
- `{"do": "setup"}`: install vLLM from the payload (`simserve/realcheck/vllm_payload/build.sh`
  builds it; parts stashed in /tmp/vc/parts by earlier calls, the rest carried in `.vllm/`);
- `{"do": "kernels", "models": [...]}`: `vllm_kernels` (vLLM's FA3 and fused ops);
- `{"do": "server", "name": N, "model": M, "args": [...]}`: stop any server, build the model
  folder (config + word-level tokenizer), start `vllm serve` with dummy weights and the
  probe, wait until it answers, warm every shape up;
- `{"do": "plan", "file": F}`: send one plan through `vllm_client` to the running server;
- `{"do": "stop"}`: stop the server and keep its log.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request

ROOT = "/tmp/vc"
SITE = "/tmp/site"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PORT = 8000
URL = f"http://127.0.0.1:{PORT}"
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
       "DO_NOT_TRACK": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0", "TOKENIZERS_PARALLELISM": "false"}


def log(msg: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    with open(os.path.join(ROOT, "campaign.log"), "a") as f:
        f.write(line + "\n")


def env(probe_dir: str | None = None) -> dict:
    e = dict(os.environ, **ENV)
    paths = [os.path.join(ROOT, "probe_site"), SITE, REPO]
    e["PYTHONPATH"] = os.pathsep.join(paths + [e.get("PYTHONPATH", "")])
    if probe_dir:
        e["SIMSERVE_PROBE_DIR"] = probe_dir
    return e


# -- steps ----------------------------------------------------------------------------------
def setup(step, st) -> None:
    if os.path.exists(os.path.join(SITE, "vllm", "__init__.py")):
        log("setup: already installed")
        return
    os.makedirs(SITE, exist_ok=True)
    wheels = sorted(glob.glob(os.path.join(REPO, ".vllm", "whl*", "*.whl")))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--target", SITE] + wheels, check=True)
    os.makedirs(os.path.join(SITE, "xgrammar"), exist_ok=True)
    stub = os.path.join(REPO, ".vllm", "stub", "xgrammar", "__init__.py")
    # the stand-in answers any attribute; vLLM's API server also imports a submodule
    for mod in ("__init__.py", "structural_tag.py"):
        shutil.copy(stub, os.path.join(SITE, "xgrammar", mod))
    parts = sorted(glob.glob(os.path.join(ROOT, "parts", "vllm.tar.xz.*"))
                   + glob.glob(os.path.join(REPO, ".vllm", "p*", "vllm.tar.xz.*")),
                   key=lambda p: p.rsplit(".", 1)[1])
    byname = {os.path.basename(p): p for p in parts}   # a part stashed and still carried
    names = sorted(byname, key=lambda n: n.rsplit(".", 1)[1])
    parts = [byname[n] for n in names]
    if not parts or [int(n.rsplit(".", 1)[1]) for n in names] != list(range(len(names))):
        raise RuntimeError(f"payload parts missing: {names}")
    log(f"setup: {len(wheels)} wheels, parts {names}")
    r = subprocess.Popen(["cat"] + parts, stdout=subprocess.PIPE)
    with tarfile.open(fileobj=r.stdout, mode="r|xz") as tf:
        tf.extractall(SITE)
    if r.wait() != 0:
        raise RuntimeError("joining the payload parts failed")
    _patch_instrumentator()
    # the probe, importable without simserve's own imports, loaded in every process
    ps = os.path.join(ROOT, "probe_site")
    os.makedirs(ps, exist_ok=True)
    shutil.copy(os.path.join(REPO, "simserve", "realcheck", "vllm_probe.py"),
                os.path.join(ps, "simserve_vllm_probe.py"))
    with open(os.path.join(ps, "sitecustomize.py"), "w") as f:
        f.write("import simserve_vllm_probe\nsimserve_vllm_probe.install()\n")
    out = subprocess.run([sys.executable, "-c", "import vllm, sys; print(vllm.__version__)"],
                         env=env(), capture_output=True, text=True)
    log(f"setup: vllm import -> {out.stdout.strip()} {out.stderr.strip()[-400:]}")


def _patch_instrumentator() -> None:
    """prometheus-fastapi-instrumentator 8.0.0 reads `route.path` of every route, which
    starlette 1.7's included routers lack: every request then fails with a 500 (seen on the
    H200, 2026-12-01). Read it with a default instead."""
    p = os.path.join(SITE, "prometheus_fastapi_instrumentator", "routing.py")
    if os.path.exists(p):
        with open(p) as f:
            src = f.read()
        with open(p, "w") as f:
            f.write(src.replace("route_name = route.path", 'route_name = getattr(route, "path", "")'))


def kernels(step, st) -> None:
    out = os.path.join(ROOT, "results", "kernels")
    subprocess.run([sys.executable, "-m", "simserve.realcheck.vllm_kernels", "--out", out,
                    "--models", ",".join(step["models"]), "--budget-s",
                    str(step.get("budget_s", 150))], env=env(), check=False)


def _health() -> bool:
    try:
        with urllib.request.urlopen(URL + "/health", timeout=2) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001
        return False


def stop(step, st) -> None:
    pid = st.get("server_pid")
    if pid:
        try:
            os.killpg(pid, signal.SIGTERM)
            for _ in range(60):
                time.sleep(0.5)
                os.killpg(pid, 0)
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log(f"server {st.get('server')} stopped")
    st["server_pid"] = None


def server(step, st) -> None:
    stop({}, st)
    from simserve.realcheck.vllm_tokenizer import model_dir
    mdir = model_dir(step["model"], os.path.join(ROOT, "models"))
    name = step["name"]
    sdir = os.path.join(ROOT, "results", name)
    probe = os.path.join(sdir, "probe")
    os.makedirs(probe, exist_ok=True)
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", mdir,
           "--served-model-name", step["model"], "--load-format", "dummy",
           "--host", "127.0.0.1", "--port", str(PORT), "--disable-uvicorn-access-log",
           "--seed", "0"] + step.get("args", [])
    t0 = time.monotonic()
    logf = open(os.path.join(sdir, "server.log"), "a")
    p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env(probe),
                         start_new_session=True, cwd=ROOT)
    st.update(server=name, server_pid=p.pid, server_model=step["model"])
    while not _health():
        if p.poll() is not None:
            raise RuntimeError(f"server {name} exited with {p.returncode}; see server.log")
        if time.monotonic() - t0 > 420:
            raise RuntimeError(f"server {name} not ready after 420 s")
        time.sleep(1)
    log(f"server {name} ready after {time.monotonic() - t0:.0f}s")
    with open(os.path.join(sdir, "server.json"), "w") as f:
        json.dump({"cmd": cmd, "ready_s": time.monotonic() - t0}, f, indent=1)
    _warmup(step["model"], sdir)


def _warmup(model: str, sdir: str) -> None:
    """Every prompt length class and batch size once, so that no kernel compiles or graph
    is first replayed inside a measured run."""
    from simserve.realcheck.vllm_client import run_plan
    reqs, i = [], 0
    for p in (16, 64, 256, 1000, 2048, 4096, 8192, 12000):
        reqs.append({"i": i, "t": 0.0, "p": p, "o": 8})
        i += 1
    for k in range(300):
        reqs.append({"i": i, "t": 0.5 + k * 0.01, "p": 200 + (k * 37) % 1800, "o": 48})
        i += 1
    t0 = time.monotonic()
    run_plan({"name": "warmup", "requests": reqs, "seed": 99}, URL, model,
             os.path.join(sdir, "_warmup"))
    log(f"warmup: {len(reqs)} requests in {time.monotonic() - t0:.0f}s")


def plan(step, st) -> None:
    from simserve.realcheck.vllm_client import run_plan
    with open(os.path.join(REPO, step["file"])) as f:
        pl = json.load(f)
    if pl["model"] != st.get("server_model"):
        raise RuntimeError(f"plan {pl['name']} is for {pl['model']}, server runs "
                           f"{st.get('server_model')}")
    out = os.path.join(ROOT, "results", st["server"], pl["name"])
    t0 = time.monotonic()
    run_plan(pl, URL, pl["model"], out)
    with open(os.path.join(out, "run.json")) as f:
        r = json.load(f)
    log(f"plan {pl['name']}: {len(pl['requests'])} requests, {r['num_errors']} errors, "
        f"{time.monotonic() - t0:.0f}s")


STEPS = {"setup": setup, "kernels": kernels, "server": server, "plan": plan, "stop": stop}


def estimate_s(step: dict) -> float:
    if step["do"] == "plan":
        with open(os.path.join(REPO, step["file"])) as f:
            pl = json.load(f)
        last = max(r["t"] for r in pl["requests"])
        closed = 0.0
        if pl.get("max_concurrency"):   # waves of `max_concurrency` requests, ~10 ms a token
            closed = sum(r["o"] for r in pl["requests"]) * 0.010 / pl["max_concurrency"]
        return last + closed + 12.0 + 0.02 * len(pl["requests"])
    return {"setup": 60, "kernels": step.get("budget_s", 150) + 30, "server": 180,
            "stop": 20}[step["do"]]


def pack(out: str, call: int) -> None:
    """Move what is new under results/ into one archive in $OUT (server logs are copied:
    the server keeps writing them)."""
    res = os.path.join(ROOT, "results")
    done = os.path.join(ROOT, "packed")
    os.makedirs(done, exist_ok=True)
    path = os.path.join(out, f"vllm-call{call}.tar.xz")
    n = 0
    with tarfile.open(path, "w:xz") as tf:
        for dirpath, _, files in os.walk(res):
            for fn in files:
                p = os.path.join(dirpath, fn)
                rel = os.path.relpath(p, res)
                tf.add(p, arcname=rel)
                n += 1
                if not fn.endswith(".log") and "_warmup" not in rel:
                    dst = os.path.join(done, rel)
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                    shutil.move(p, dst)
        tf.add(os.path.join(ROOT, "campaign.log"), arcname="campaign.log")
    log(f"packed {n} files into {os.path.basename(path)} ({os.path.getsize(path) / 1e6:.1f} MB)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--campaign", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=540)
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    os.makedirs(ROOT, exist_ok=True)
    state_path = os.path.join(ROOT, "state.json")
    st = {"next": 0, "call": 0, "server_pid": None}
    if os.path.exists(state_path):
        with open(state_path) as f:
            st = json.load(f)
    st["call"] += 1
    with open(a.campaign) as f:
        steps = json.load(f)
    log(f"call {st['call']}: from step {st['next']} of {len(steps)}")
    while st["next"] < len(steps):
        step = steps[st["next"]]
        left = a.budget_s - (time.monotonic() - t0)
        if estimate_s(step) > left:
            log(f"stop before step {st['next']} ({step['do']}): needs ~{estimate_s(step):.0f}s, "
                f"{left:.0f}s left")
            break
        try:
            STEPS[step["do"]](step, st)
        except Exception as exc:  # noqa: BLE001 - record, skip to the next step
            log(f"step {st['next']} {step} failed: {exc!r}")
            if step["do"] == "server":   # skip this server's plans
                while st["next"] + 1 < len(steps) and steps[st["next"] + 1]["do"] == "plan":
                    st["next"] += 1
        st["next"] += 1
        with open(state_path, "w") as f:
            json.dump(st, f)
    pack(a.out, st["call"])
    with open(state_path, "w") as f:
        json.dump(st, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
