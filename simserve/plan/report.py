"""What a plan hands a person: the ranked table, the Pareto plots, the winner's experiment YAML
(`simserve run` reproduces it) and, for vLLM designs, its `vllm serve` flags."""
from __future__ import annotations

import math

import yaml

from simserve.plan.simulate import experiment
from simserve.plan.space import Candidate

# Hugging Face ids of the catalog's models, for `vllm serve`
HF_IDS = {"llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
          "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
          "qwen3-8b": "Qwen/Qwen3-8B", "qwen3-14b": "Qwen/Qwen3-14B", "qwen3-32b": "Qwen/Qwen3-32B"}
FRESH_SEEDS = (1000, 1001, 1002)  # the winner's YAML: seeds the plan never simulated
COLUMNS = (("rank", "#", "{}"), ("config", "config", "{}"), ("usd_per_hour", "$/h", "{:.2f}"),
           ("usd_per_mtok", "$/Mtok out", "{:.3f}"), ("sustained", "sustained req/s", "{}"),
           ("estimate", "screen req/s", "{:.3g}"), ("estimate_error", "screen err", "{:+.0%}"),
           ("slo_attainment", "SLO att.", "{:.1%}"), ("tok_s_per_gpu", "tok/s/GPU", "{:.0f}"),
           ("tok_s_per_user", "tok/s/user", "{:.1f}"), ("status", "status", "{}"),
           ("fidelity", "simulated with", "{}"))


def row(c: Candidate, hourly: float, est, r: dict | None) -> dict:
    """One table row: the screen's estimate, and the simulation's result where there is one."""
    out = {"config": c.label, "design": c.design, "policy": c.policy, "gpu": c.gpu,
           "num_gpus": c.num_gpus, "cpu": c.cpu if c.host_cores() else None,
           "cpu_cores": c.host_cores() or None, "options": c.opts, "usd_per_hour": hourly,
           "decode_gpu": c.decode_pool[0] if c.decode_pool else None,
           "decode_num_gpus": c.decode_pool[1] if c.decode_pool else None,
           "estimate": est.rate, "estimate_bound": est.bound, "status": "screened"}
    if r is None:
        return out
    if "error" in r:
        return dict(out, status="error", error=r["error"])
    at = r.get("at") or {}
    rate = float(r.get("rate") or 0.0)
    out.update(rate=rate, status=r.get("status", "final"), rung=r.get("rung"),
               fidelity=r.get("fidelity"),
               censored=r.get("censored"), num_simulations=r.get("num_simulations"), **at)
    out["sustained"] = ("≥ " if r.get("censored") and rate > 0 else "") + f"{rate:.3g}"
    if rate > 0 and not r.get("censored"):
        out["estimate_error"] = est.rate / rate - 1
    tput = at.get("output_throughput")
    if tput:
        out["usd_per_mtok"] = hourly / (tput * 3600 / 1e6)
        out["tok_s_per_gpu"] = tput / c.total_gpus
    if at.get("mean_tpot_ms"):
        out["tok_s_per_user"] = 1000.0 / at["mean_tpot_ms"]
    return out


def accuracy(c: Candidate) -> str:
    from simserve.accuracy import accuracy_lines
    gpu = c.gpu if not c.decode_pool else f"{c.gpu} (prefill) + {c.decode_pool[0]} (decode)"
    lines = accuracy_lines([{"policy_name": c.design, "policy": c.design, "gpu": gpu,
                             "policy_options": c.opts}])
    return lines[0] if lines else ""


def format_table(rows: list[dict], limit: int | None = 20) -> str:
    shown = rows[:limit] if limit else rows
    cells = [[h for _, h, _ in COLUMNS]]
    for r in shown:
        line = []
        for key, _, fmt in COLUMNS:
            v = r.get(key)
            line.append("-" if v is None or (isinstance(v, float) and math.isnan(v))
                        else fmt.format(v))
        cells.append(line)
    w = [max(len(x[i]) for x in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(x.ljust(w[i]) if i == 1 else x.rjust(w[i]) for i, x in enumerate(row))
             for row in cells]
    lines.insert(1, "  ".join("-" * x for x in w))
    more = f"\n({len(rows) - len(shown)} more rows in plan.csv)" if len(rows) > len(shown) else ""
    accs = list(dict.fromkeys(r["accuracy"] for r in shown if r.get("accuracy")))
    return "\n".join(lines + ([""] + accs if accs else [])) + more


def winner_yaml(spec, c: Candidate, rate: float) -> str:
    """The winner as an experiment YAML at the planned rate (the sustained one when the plan
    maximised), with seeds the plan did not simulate."""
    exp = experiment(spec, c, [round(rate, 4)], FRESH_SEEDS)
    head = (f"# {c.label}: the winner of plan {spec.name!r} ({spec.source});\n"
            f"# reproduce with: simserve run THIS_FILE\n")
    return head + yaml.safe_dump(exp, sort_keys=False, default_flow_style=None)


def vllm_flags(spec, c: Candidate) -> str | None:
    """`vllm serve ...` for a vLLM-family winner (data-parallel replicas as DP ranks)."""
    if c.design not in ("vllm", "sarathi"):
        return None
    o = c.opts
    parts = [f"vllm serve {HF_IDS.get(c.model, c.model)}",
             f"--tensor-parallel-size {int(o.get('tp', 1))}"]
    if c.replicas > 1:
        parts.append(f"--data-parallel-size {c.replicas}")
    for key, flag in (("max_num_batched_tokens", "--max-num-batched-tokens"),
                      ("max_num_seqs", "--max-num-seqs"),
                      ("gpu_memory_utilization", "--gpu-memory-utilization"),
                      ("block_size", "--block-size")):
        if o.get(key) is not None:
            parts.append(f"{flag} {o[key]}")
    if o.get("enable_prefix_caching") is False:
        parts.append("--no-enable-prefix-caching")
    if c.design == "sarathi":
        parts.append("# sarathi: reserve whole prompts (vLLM has no such flag)")
    text = " \\\n    ".join(parts)
    router = o.get("router")
    if c.replicas > 1 and router:
        text += (f"\n# {c.replicas} replicas behind a {router} router (the plan's choice); "
                 "with separate servers put the SGLang router or llm-d in front")
    return text


def pareto(points: list[tuple[float, float]], lower_x: bool = True) -> list[int]:
    """Indices of the points on the front: lower (or higher) x, higher y."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0] if lower_x
                                                      else -points[i][0], -points[i][1]))
    best, out = -math.inf, []
    for i in order:
        if points[i][1] > best:
            out.append(i)
            best = points[i][1]
    return out


def plot(rows: list[dict], path=None, title: str = ""):
    """Two panels: cost per hour vs goodput (sustained req/s); tok/s/GPU vs tok/s/user.
    Filled markers were simulated at the last rung, hollow ones stopped at the first."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sim = [r for r in rows if r.get("rate")]
    final = [r for r in sim if r.get("status") in ("final", "router")]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {d: f"C{i}" for i, d in enumerate(sorted({r["design"] for r in sim}))}
    for r in sim:   # hollow: stopped at the first rung (fewer requests and seeds)
        full = r in final
        kw = {"s": 20, "edgecolors": colors[r["design"]],
              "facecolors": colors[r["design"]] if full else "none"}
        a.scatter(r["usd_per_hour"], r["rate"], **kw)
        if r.get("tok_s_per_user"):
            b.scatter(r["tok_s_per_user"], r["tok_s_per_gpu"], **kw)
    for d, col in colors.items():
        a.scatter([], [], color=col, label=d, s=20)
    front = pareto([(r["usd_per_hour"], r["rate"]) for r in final])
    pts = sorted((final[i]["usd_per_hour"], final[i]["rate"]) for i in front)
    if pts:
        a.step(*zip(*pts), where="post", color="k", lw=0.8, label="Pareto front (full rung)")
    a.set(xlabel="cost, USD per hour", ylabel="sustained rate at the SLO, req/s",
          title="cost vs goodput")
    b.set(xlabel="tokens/s per user (1 / mean TPOT)", ylabel="output tokens/s per GPU",
          title="throughput vs interactivity")
    a.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig
