"""Figures. Each function takes `ax=None` (or a figure for multi-panel plots) and returns
what it drew on, so notebooks can compose them."""
from __future__ import annotations

import numpy as np


def _axes(ax):
    if ax is None:
        import matplotlib.pyplot as plt
        _, ax = plt.subplots(figsize=(6, 4))
    return ax


def profile_fit_1d(points_x, points_us, curve, title: str, ax=None, xlabel="tokens"):
    """Measured medians (dots) and the fitted table (line), log-log."""
    ax = _axes(ax)
    ax.loglog(points_x, points_us, "o", ms=3, alpha=0.7, label="measured median")
    xs = np.geomspace(max(min(points_x), 1), max(points_x) * 2, 200)
    ax.loglog(xs, curve(xs), "-", lw=1.2, label="fit (beyond: roofline ratio)")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("time per call (µs)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return ax


def profile_fit_grid(xv, yv, us, grid, title: str, ax=None, x_label="batch", y_label="context"):
    """One line per grid row x: measured medians (dots) and the fitted grid over y."""
    ax = _axes(ax)
    xv, yv, us = map(np.asarray, (xv, yv, us))
    rows = np.unique(xv)
    cmap = __import__("matplotlib").colormaps["viridis"]
    for i, x in enumerate(rows):
        m = xv == x
        color = cmap(i / max(len(rows) - 1, 1))
        ax.loglog(np.maximum(yv[m], 1), us[m], "o", ms=3, color=color)
        ys = np.geomspace(max(yv[m].min(), 1), yv[m].max(), 100)
        ax.loglog(ys, grid(x, ys), "-", lw=1, color=color, label=f"{x_label} {int(x)}")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(f"{y_label} (tokens)")
    ax.set_ylabel("time per layer (µs)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    return ax


# --------------------------------------------------------------------------- rate curves
# Inputs are summary records (dicts, as in summary.json) or a DataFrame of them; sustainable
# rates come in precomputed (`simserve.capacity.Capacity`): plots draw, not compute.

# metric: (title, short name for the y label, unit shown, factor from the metric's unit, log y)
METRIC_DISPLAY = {
    "mean_normalized_latency_s": ("Mean normalized latency", "mean E2E / output tokens",
                                  "s/token", 1.0, True),
    "p99_ttft_ms": ("P99 time to first token", "P99 TTFT", "s", 1e-3, True),
    "p99_itl_ms": ("P99 inter-token latency", "P99 ITL", "s", 1e-3, True),
    "p99_tpot_ms": ("P99 time per output token", "P99 TPOT", "s", 1e-3, True),
    "slo_attainment": ("SLO attainment", "requests meeting every deadline", "%", 100.0, False),
    "request_goodput": ("Goodput (vLLM: TTFT/TPOT/E2E thresholds)", "goodput", "req/s", 1.0,
                        False),
    "slo_goodput": ("SLO goodput", "requests meeting every deadline", "req/s", 1.0, False),
    "request_throughput": ("Request throughput", "throughput", "req/s", 1.0, False),
    "output_throughput": ("Output throughput", "throughput", "tok/s", 1.0, False),
}
LATENCY_PANELS = ("mean_normalized_latency_s", "p99_ttft_ms", "p99_itl_ms", "p99_tpot_ms")
MARKERS = "osD^vPX*<>"


def metric_display(metric: str) -> tuple[str, str, str, float, bool]:
    """(title, y-label name, unit, factor to that unit, log y) for a summary key."""
    if metric in METRIC_DISPLAY:
        return METRIC_DISPLAY[metric]
    name = metric.replace("_", " ")
    for suffix, f in (("_ms", 1e-3), ("_s", 1.0)):
        if metric.endswith(suffix):
            name = " ".join(w.upper() if w[0] == "p" and w[1:].isdigit() or w in (
                "ttft", "itl", "tpot", "e2el") else w for w in name[: -len(suffix)].split())
            return name, name, "s", f, True
    return name, name, "", 1.0, False


def _plain_log_ticks(ax) -> None:
    """0.1, 0.2, 0.5, 1 instead of 10^-1, 2x10^-1 on a log y axis (1-2-5 steps up to three
    decades, decades beyond)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    lo, hi = ax.get_ylim()
    if lo > 0 and hi / lo < 1000:
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _records(records) -> list[dict]:
    from simserve.capacity import as_records
    return as_records(records)


def group_styles(labels) -> dict:
    """A fixed colour and marker per curve label, in order, so every figure agrees."""
    import matplotlib
    cmap = matplotlib.colormaps["tab10"]
    return {lab: {"color": cmap(i % 10), "marker": MARKERS[i % len(MARKERS)]}
            for i, lab in enumerate(labels)}


def _fmt_value(v: float, unit: str) -> str:
    return f"{v:.0f} %" if unit == "%" else f"{v:g} {unit}".strip()


def _linear_segments(x, y, per_segment: int = 24):
    """Points along the piecewise-linear curve through (x, y), dense enough to look straight
    or curved as the axis scale makes it."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2:
        return x, y
    t = np.linspace(0.0, 1.0, per_segment, endpoint=False)
    xs = np.concatenate([x[i] + t * (x[i + 1] - x[i]) for i in range(len(x) - 1)] + [x[-1:]])
    return xs, np.interp(xs, x, y)


def _capacity_marks(caps, styles, ty: float) -> list[dict]:
    """Where each curve's sustainable rate sits on the target line; marks that coincide (all
    censored at the same rate) are merged into one grey mark."""
    marks: dict[tuple, dict] = {}
    for cap in caps:
        lo, hi = cap.bounds
        if lo == hi:
            key, text = (lo, "o", group_label_of(cap)), f"{lo:.3g}"
        elif hi == float("inf"):
            key, text = (lo, ">"), f"≥{lo:.3g}"
        else:
            key, text = (hi, "<"), f"<{hi:.3g}"
        m = marks.setdefault(key, {"x": key[0], "y": ty, "marker": key[1], "text": text,
                                   "colors": []})
        m["colors"].append(styles.get(group_label_of(cap), {"color": "0.3"})["color"])
    return sorted(marks.values(), key=lambda m: m["x"])


def rate_curve(records, metric: str, ax=None, *, target=None, capacities=(), styles=None,
               logy: bool | None = None, legend: bool = True, title: str | None = None):
    """One metric against the request rate, a line per policy (and variant / swept keys).

    Seeds are averaged (a band shows their min–max when there are several). `target` (a
    `capacity.Target`) draws its line; `capacities` (`capacity.Capacity`, any target: those of
    `target` are used) mark where each curve crosses it: ○ at the interpolated rate, ▷ '≥ r'
    when it never crossed (censored high), ◁ '< r' when even the lowest rate failed."""
    from simserve.capacity import rate_curves
    ax = _axes(ax)
    name, short, unit, f, log_default = metric_display(metric)
    logy = log_default if logy is None else logy
    curves = rate_curves(_records(records), metric)
    styles = styles or group_styles([c.label for c in curves])
    for c in curves:
        st = styles[c.label]
        y = c.values * f
        ok = np.isfinite(y) & ((y > 0) if logy else True)
        # Segments are drawn linear in the value, as the sustainable rate interpolates them
        # (on a log axis a plain straight segment would miss the marks).
        xd, yd = _linear_segments(c.rates[ok], y[ok])
        ax.plot(xd, yd, color=st["color"], marker=st["marker"], ls=st.get("ls", "-"),
                mfc=st.get("mfc", st["color"]), mec=st["color"], alpha=st.get("alpha", 1.0),
                ms=6 if st["marker"] in "*PX" else 5, lw=1.8,
                markevery=list(np.flatnonzero(np.isin(xd, c.rates[ok]))),
                label=st.get("label", c.label), zorder=3)
        if c.num_seeds > 1:
            xb, lo = _linear_segments(c.rates, c.vmin * f)
            _, hi = _linear_segments(c.rates, c.vmax * f)
            ax.fill_between(xb, lo, hi, color=st["color"], alpha=0.15, lw=0, zorder=2)
    if logy:
        ax.set_yscale("log")
    marks, fixed = [], []
    if target is not None:
        ty = target.value * f
        sym = "≤" if target.op == "<=" else "≥"
        ax.axhline(ty, color="0.25", ls="--", lw=1.2, label=f"target {sym} {_fmt_value(ty, unit)}",
                   zorder=1)
        fixed = [ax.annotate(f"target {sym} {_fmt_value(ty, unit)}", (0.01, ty),
                    xycoords=("axes fraction", "data"), xytext=(2, 3 if target.op == "<=" else -3),
                    textcoords="offset points", va="bottom" if target.op == "<=" else "top",
                    fontsize=8, color="0.25")]
        marks = _capacity_marks([c for c in capacities if c.target == target], styles, ty)
        if logy and marks:  # room above the line for the labels
            lo, hi = ax.get_ylim()
            ax.set_ylim(lo, max(hi, ty * 1.6))
    # Labels sit where a rising latency curve is not (above left of the mark); for a falling
    # attainment curve, below left.
    above = target is None or target.op == "<="
    texts = []
    for m in marks:
        color = m["colors"][0] if len(m["colors"]) == 1 else "0.35"
        ax.plot([m["x"]], [m["y"]], m["marker"], ms=10, mfc="white", mec=color, mew=2.2,
                zorder=5)
        texts.append(ax.annotate(
            m["text"], (m["x"], m["y"]), xytext=(-7, 7 if above else -7),
            textcoords="offset points", ha="right", va="bottom" if above else "top",
            fontsize=8.5, color=color, fontweight="bold", zorder=6,
            bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85)))
    ax._simserve_value_labels = (texts, 1 if above else -1, fixed)
    separate_labels(ax, texts, 1 if above else -1, fixed)
    bottom, top = ax.get_ylim()
    for m in marks:
        if m["marker"] == "o":  # drop a line from an exact crossing to the rate axis
            ax.plot([m["x"], m["x"]], [bottom, m["y"]], ":", color=m["colors"][0], lw=1.2,
                    zorder=1)
    ax.set_ylim(bottom, top)
    if logy:
        _plain_log_ticks(ax)
    ax.set_title(title or name, fontsize=11)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel(f"{short} ({unit})" if unit else short)
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.12)
    if legend:  # outside the data, to the right
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return ax


def separate_labels(ax, texts, direction: int = 1, fixed=(), gap_px: float = 2.0) -> None:
    """Move value labels apart: each label that overlaps one already placed (or a `fixed`
    text) is pushed along `direction` (+1 up, -1 down, in screen space) until it overlaps
    none. Positions depend on the final layout: `declutter(fig)` redoes it before saving."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    pt_per_px = 72.0 / fig.dpi
    for t in texts:   # from where the label was first put
        if not hasattr(t, "_simserve_xyann"):
            t._simserve_xyann = t.xyann
        t.xyann = t._simserve_xyann
    placed = [t.get_window_extent(renderer) for t in fixed]
    for t in texts:
        box = t.get_window_extent(renderer)
        shift = 0.0
        while True:
            moved = box.translated(0, shift)
            hit = [b for b in placed if moved.overlaps(b)]
            if not hit:
                break
            edge = (max(b.y1 for b in hit) - box.y0 if direction > 0
                    else min(b.y0 for b in hit) - box.y1)
            shift = edge + gap_px * direction
        if shift:
            x, y = t.xyann
            t.xyann = (x, y + shift * pt_per_px)
        placed.append(box.translated(0, shift))


def declutter(fig) -> None:
    """Lay the figure out, then move every rate plot's value labels apart for that layout
    (call it last before saving: a layout change moves the marks the labels belong to)."""
    fig.canvas.draw()
    for ax in fig.axes:
        labels = getattr(ax, "_simserve_value_labels", None)
        if labels:
            separate_labels(ax, labels[0], labels[1], labels[2])


def group_label_of(cap) -> str:
    from simserve.capacity import group_label
    return group_label(cap.group)


def latency_vs_rate(records, ax=None, *, metric: str = "p99_ttft_ms", target=None,
                    capacities=(), styles=None, logy: bool | None = None, legend: bool = True):
    """Latency against request rate per policy, with the target line and sustainable rates."""
    return rate_curve(records, metric, ax, target=target, capacities=capacities, styles=styles,
                      logy=logy, legend=legend)


def attainment_vs_rate(records, ax=None, *, target=None, capacities=(), styles=None,
                       legend: bool = True):
    """SLO attainment (%) against request rate, with the threshold line (default 95 %)."""
    if target is None:
        from simserve.capacity import parse_target
        target = parse_target("slo_attainment>=0.95")
    ax = rate_curve(records, "slo_attainment", ax, target=target, capacities=capacities,
                    styles=styles, logy=False, legend=legend,
                    title="SLO attainment (per-token deadlines)")
    ax.set_ylim(-3, 105)
    ax.yaxis.set_major_formatter(__import__("matplotlib.ticker").ticker.FuncFormatter(
        lambda v, _: f"{v:.0f}"))
    return ax


def latency_panels(records, fig=None, *, metrics=LATENCY_PANELS, targets=(), capacities=(),
                   styles=None, title: str | None = None):
    """A grid of latency-vs-rate panels sharing one legend below them; returns the axes (flat
    array). `targets` (one per metric) and `capacities` as in `rate_curve`."""
    import matplotlib.pyplot as plt
    n = len(metrics)
    ncols = 2 if n > 1 else 1
    nrows = -(-n // ncols)
    if fig is None:
        fig = plt.figure(figsize=(5.6 * ncols, 4.2 * nrows + 0.9), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    by_metric = {t.metric: t for t in targets}
    for ax, m in zip(axes, metrics):
        rate_curve(records, m, ax, target=by_metric.get(m), capacities=capacities,
                   styles=styles, legend=False)
    for ax in axes[n:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=13)
    _figure_legend(fig, axes[0], axes[n] if n < len(axes) else None)
    return axes[:n]


def _figure_legend(fig, ax, slot=None) -> None:
    """One legend for all panels: in the empty panel `slot` if there is one, else below."""
    handles, labels = ax.get_legend_handles_labels()
    lines = [h for h, lab in zip(handles, labels) if not lab.startswith("target")]
    labs = [lab for lab in labels if not lab.startswith("target")]
    import matplotlib.lines as mlines
    lines.append(mlines.Line2D([], [], color="0.25", ls="--"))
    labs.append("target")
    lines.append(mlines.Line2D([], [], ls="", marker="o", ms=8, mfc="white", mec="0.3", mew=2))
    labs.append("sustainable rate (▷ never crossed: at least)")
    engine = fig.get_layout_engine()
    outside = engine is not None and type(engine).__name__ == "ConstrainedLayoutEngine"
    if slot is not None:
        slot.set_visible(True)
        slot.axis("off")
        slot.legend(lines, labs, loc="center", fontsize=10, frameon=False)
        return
    ncol = min(len(labs), 4 if max(map(len, labs)) < 30 else 2)
    fig.legend(lines, labs, loc="outside lower center" if outside else "lower center",
               ncol=ncol, fontsize=9.5, frameon=False)


# --------------------------------------------------------------------------- token timelines


def _cumulative_exact(token_times_s, grid):
    t = np.sort(np.asarray(token_times_s, dtype=np.float64))
    t = t[np.isfinite(t)]
    return np.searchsorted(t, grid, side="right")


def _cumulative_linear(first, finish, n_out, grid, chunk: int = 2048):
    """Tokens per request spread linearly between its first and last token (one at the first;
    an unfinished request counts its first token only)."""
    total = np.zeros(len(grid))
    for s in range(0, len(first), chunk):
        a, b, n = first[s:s + chunk, None], finish[s:s + chunk, None], n_out[s:s + chunk, None]
        started = grid[None, :] >= a
        span = np.where(np.isfinite(b) & (b > a), b - a, np.nan)
        frac = np.where(np.isfinite(span), np.clip((grid[None, :] - a) / span, 0, 1),
                        np.where(np.isfinite(b), 1.0, 0.0))
        total += np.nansum(np.where(started, 1 + (n - 1) * frac, 0), axis=0)
    return total


def token_timeline(requests, ax=None, *, token_times=None, by: str = "policy", styles=None,
                   offered: bool = True, num_points: int = 800):
    """Cumulative generated tokens over time, a line per `by` value of one point's requests
    (a `requests.csv` frame filtered to one rate and seed).

    `token_times` maps a label to every token time of that run (`RequestRecords.token_times_s`)
    for the exact curve; a label without them is approximated linearly between each request's
    first token and finish, and the legend says so. `offered` adds the output tokens of the
    requests that have arrived (what an infinitely fast server would have produced)."""
    from matplotlib.ticker import EngFormatter
    ax = _axes(ax)
    token_times = token_times or {}
    labels = list(dict.fromkeys(requests[by])) if by in requests else ["run"]
    styles = styles or group_styles(labels)
    end = np.nanmax(requests["finish_s"].to_numpy(dtype=float), initial=0.0)
    end = max(end, float(requests["arrival_s"].max()))
    grid = np.linspace(0.0, end * 1.02, num_points)
    for lab in labels:
        fr = requests[requests[by] == lab] if by in requests else requests
        st = styles.get(lab, {"color": None})
        if lab in token_times:
            y, note, ls = _cumulative_exact(token_times[lab], grid), "", "-"
        else:
            y = _cumulative_linear(fr["first_token_s"].to_numpy(float),
                                   fr["finish_s"].to_numpy(float),
                                   fr["output_tokens"].to_numpy(float), grid)
            note, ls = " (approx.: linear first→last token)", "-"
        ax.plot(grid, y, ls, color=st["color"], lw=2, label=f"{lab}{note}")
    if offered:
        fr = requests[requests[by] == labels[0]] if by in requests else requests
        arr = fr["arrival_s"].to_numpy(float)
        order = np.argsort(arr)
        cum = np.cumsum(fr["output_tokens"].to_numpy(float)[order])
        idx = np.searchsorted(arr[order], grid, side="right")
        ax.plot(grid, np.where(idx > 0, cum[np.maximum(idx - 1, 0)], 0), "--", color="0.55",
                lw=1.3, label="demand: output tokens of the requests arrived so far")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("cumulative generated tokens")
    ax.yaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set_xlim(0, grid[-1])
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.35)
    ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
    return ax
