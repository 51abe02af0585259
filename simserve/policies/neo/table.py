"""NEO's own performance model: `TablePerfPredictor` (`swiftllm/perfpredictor.py` of
NEO-MLSys25/NEO), filled by a profiling pass on NEO's grid and interpolated as its code does.

NEO's profiler (`swiftllm/server/profiler.py::ModelProfiler`) runs artificial batches on the
real GPU and CPU at a coarse grid of sizes and stores per-layer times; between grid points the
predictor interpolates linearly (bilinearly for CPU attention). Here the profiling pass reads
the simulator's hardware profile *at NEO's grid points only*, the way NEO's profiler reads
the hardware there; the round decisions then see the grid and its interpolation, while the
round itself is priced by the cost models at its exact shape. The difference is NEO's
prediction error, and it is real: off-grid widths are interpolated, GPU decode attention is a
function of the KV tokens alone (profiled with as few sequences as hold them), CPU attention
is profiled with the tokens split evenly over the sequences, and the CPU launch term is the
oracle's (`NeoConfig.cpu_launch_ms`, NEO's hard-coded 0.8 ms by default: one source).

Grids (`TablePerfPredictor.__init__`; `bs` = block size, `T` = max tokens in a batch,
`Ng`/`Nc` = tokens the GPU / host KV pool holds, `B` = max batch size, `Lmax` = max sequence
length):

    T_lin(S)     S in 1..511, then 2^9, 2^10, ... below T, then T     one prefill of S tokens
    T_pref(l)    3·2^(i-2) and 2^i for i from bitlen(bs-1) below bitlen(T-1), then T
    T_gdec(N)    the same series up to Ng; ceil(N / Lmax) decodes holding N tokens
    T_cdec(S,N)  S in 1, 2, 4, ... below B, then B; per S, N from S·bs through powers of two
                 to min(S·Lmax, Nc); S decodes with N tokens split evenly (whole blocks)

CPU-attention entries outside an S's range are filled as `_profile_cdec` fills them
(parallelogram rule from the neighbouring row). Interpolation (`_interp_1d`, `get_cdec_T`):
x = 0 costs 0; x at or below the first grid point takes its value; between points, linear.
NEO asserts x never passes the last point; here a width past it (a re-prefill after a
recompute can exceed the token budget) extends the last segment, and `beyond` counts them.
"""
from __future__ import annotations

from bisect import bisect_left

import numpy as np

from simserve.policies.neo.predictor import Predictor

def _doubling(lo_bits: int, hi_bits: int) -> list[int]:
    """NEO's 3·2^(i-2), 2^i series for i in [lo_bits, hi_bits)."""
    out: list[int] = []
    for i in range(lo_bits, hi_bits):
        out += [2 ** (i - 2) * 3, 2 ** i]
    return out


def grids(block_size: int, max_tokens: int, max_batch: int, max_seq_len: int,
          gpu_tokens: int, cpu_tokens: int) -> dict:
    """NEO's grid points (`TablePerfPredictor.__init__`)."""
    lin = list(range(1, 512)) + [2 ** i for i in range(9, (max_tokens - 1).bit_length())] \
        + [max_tokens]
    pref = _doubling((block_size - 1).bit_length(), (max_tokens - 1).bit_length()) + [max_tokens]
    gdec = _doubling((block_size - 1).bit_length(), (gpu_tokens - 1).bit_length()) + [gpu_tokens]
    cs = [2 ** i for i in range((max_batch - 1).bit_length())] + [max_batch]
    n_lists = []
    for s in cs:
        top = min(s * max_seq_len, cpu_tokens)
        lo = min(s * block_size, top)   # (tiny pools only: NEO's list would be unsorted)
        n_lists.append([lo] + [2 ** i for i in range(lo.bit_length(), (top - 1).bit_length())]
                       + ([top] if top > lo else []))
    agg = sorted({n for nl in n_lists for n in nl})
    # (sorted and unique: NEO's lists already are for budgets of 512 tokens or more)
    return {"lin": _sorted(lin), "pref": _sorted(pref), "gdec": _sorted(gdec),
            "cdec_s": _sorted(cs), "cdec_n": n_lists, "cdec_agg": agg}


def _sorted(xs: list[int]) -> list[int]:
    return sorted(set(xs))


def _lerp(x, x0, x1, y0, y1) -> float:
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)      # `TablePerfPredictor._interp`


class Table1D:
    """One of NEO's 1-D tables with `_interp_1d`'s semantics (see the module docstring).
    Lookups within the grid are remembered by their argument (a pure function of it; a
    lookup past the grid is computed, and counted, every time)."""

    __slots__ = ("beyond", "memo", "xs", "ys")

    def __init__(self, xs: list[int], ys: list[float]):
        self.xs, self.ys, self.beyond = xs, ys, 0
        self.memo: dict[int, float] = {}

    def __call__(self, x) -> float:
        v = self.memo.get(x)
        if v is None:
            v = self.lookup(x)
            if x <= self.xs[-1]:
                if len(self.memo) >= 8192:
                    self.memo.clear()
                self.memo[x] = v
        return v

    def lookup(self, x) -> float:
        if x == 0:
            return 0.0
        xs, ys = self.xs, self.ys
        i = bisect_left(xs, x)           # smallest i with xs[i] >= x (NEO's `lb_idx` lists)
        if i == len(xs):                 # past the last point: NEO asserts; extend the segment
            self.beyond += 1
            i = len(xs) - 1
        elif i == 0 or x == xs[i]:
            return ys[i]
        return _lerp(x, xs[i - 1], xs[i], ys[i - 1], ys[i])


def _fill_cdec(T: list[list[float]]) -> None:
    """`_profile_cdec`'s hole filling: entries below a row's range (0.0) from the row above,
    entries past it (inf) from the row below (parallelogram rule)."""
    nS, nN = len(T), len(T[0])
    for i in range(nS):
        for j in reversed(range(nN)):
            if T[i][j] == 0.0:
                T[i][j] = T[i - 1][j] + T[i][j + 1] - T[i - 1][j + 1]
    for i in reversed(range(nS)):
        for j in range(nN):
            if T[i][j] == float("inf"):
                T[i][j] = T[i + 1][j] + T[i][j - 1] - T[i + 1][j - 1]


def _fast_cdec(cs: list[int], xs: list[int], ys: list[list[float]], ref):
    """`TablePredictor.cdec_ref` for n >= 1 as one closure, with the same floats: per n the
    grid rows it reads and its offset in the S interval, per row the differences of
    neighbouring entries and between neighbouring rows, taken once (the subtractions `_lerp`
    would repeat at every call; the multiplications and divisions stay in `_lerp`'s order).
    Lookups past the token grid go to `ref`, which counts them."""
    nx = len(xs)
    dx = [0] + [xs[j] - xs[j - 1] for j in range(1, nx)]
    dy = [[0.0] + [r[j] - r[j - 1] for j in range(1, nx)] for r in ys]
    per_n: list = [None]           # per n: (row a, its dy, None) on a grid S, else
    for n in range(1, cs[-1] + 1):  # (row a, its dy, row b, its dy, b − a, n − S_a, S_b − S_a)
        i = bisect_left(cs, n)
        if n == cs[i]:
            per_n.append((ys[i], dy[i], None))
        else:
            a, b = ys[i - 1], ys[i]
            per_n.append((a, dy[i - 1], b, dy[i], [q - p for p, q in zip(a, b)],
                          n - cs[i - 1], cs[i] - cs[i - 1]))

    def cdec(n: int, ctx: int) -> float:
        try:
            e = per_n[n]
        except IndexError:
            return ref(n, ctx)       # (raises: past max_batch_size)
        if ctx == 0:
            return 0.0
        j = bisect_left(xs, ctx)
        if j == nx:
            return ref(n, ctx)       # past the last point: extended and counted there
        row = e[0]
        if e[2] is None:
            if j == 0 or ctx == xs[j]:
                return row[j]
            return row[j - 1] + e[1][j] * (ctx - xs[j - 1]) / dx[j]
        if j == 0 or ctx == xs[j]:
            return row[j] + e[4][j] * e[5] / e[6]
        k = ctx - xs[j - 1]
        ya = row[j - 1] + e[1][j] * k / dx[j]
        yb = e[2][j - 1] + e[3][j] * k / dx[j]
        return ya + (yb - ya) * e[5] / e[6]
    return cdec


class TablePredictor(Predictor):
    """NEO's `TablePerfPredictor` for the round decisions. Construct with `profile` (below);
    the cost models it inherits from `Predictor` are read only by that profiling pass and by
    the simulated-time methods, never by a decision."""

    def __init__(self, oracle: Predictor, tables: dict, lnch_us: float | None = None):
        # NEO's CPU launch term (`TablePerfPredictor.lnch_T`): the oracle's unless given, which
        # comes from the policy's `cpu_launch_ms` (NEO's value is its default)
        super().__init__(oracle.model, oracle.gpu, oracle.cpu, oracle.h2d, oracle.d2h, oracle.tp,
                         oracle.lnch_us if lnch_us is None else lnch_us)
        self.lin_t = tables["lin"]
        self.pref_t = tables["pref"]
        self.gdec_t = tables["gdec"]
        self.cdec_s: list[int] = tables["cdec_s"]
        self.cdec_rows: list[Table1D] = tables["cdec_rows"]
        self.cdec_xs = self.cdec_rows[0].xs               # the grid every row shares
        self.cdec_ys = [r.ys for r in self.cdec_rows]
        self.grid = tables["grid"]
        self._cdec_fast = _fast_cdec(self.cdec_s, self.cdec_xs, self.cdec_ys, self.cdec_ref)

    # -- NEO's four functions (µs per layer) -----------------------------------------------
    def lin(self, tokens: int) -> float:
        return self.lin_t(tokens)

    def pref(self, prompt_len: int) -> float:
        return self.pref_t(prompt_len)

    def gdec(self, n: int, ctx: int) -> float:
        return self.gdec_t(ctx) if n else 0.0        # NEO's T_gdec(N): the tokens alone

    def cdec(self, n: int, ctx: int) -> float:
        return self._cdec_fast(n, ctx) if n else 0.0

    def cdec_positive(self):
        return self._cdec_fast

    def cdec_ref(self, n: int, ctx: int) -> float:
        """`get_cdec_T`: bilinear in the CPU batch size (grid S) and tokens (each row). Every
        row shares the token grid, so the token index is found once for both rows (the same
        floats as `Table1D` on each row). `cdec` computes the same floats faster."""
        if not n:
            return 0.0
        cs = self.cdec_s
        i = bisect_left(cs, n)
        if i == len(cs):
            raise ValueError(f"neo predictor: CPU batch {n} exceeds max_batch_size {cs[-1]}")
        if i == 0 or n == cs[i]:
            return self.cdec_rows[i](ctx)
        if ctx == 0:
            return 0.0
        xs = self.cdec_xs
        j = bisect_left(xs, ctx)
        y0, y1 = self.cdec_ys[i - 1], self.cdec_ys[i]
        if j == len(xs):              # past the last point (see `Table1D`)
            self.cdec_rows[i].beyond += 1
            j -= 1
        elif j == 0 or ctx == xs[j]:
            return _lerp(n, cs[i - 1], cs[i], y0[j], y1[j])
        x0, x1 = xs[j - 1], xs[j]
        return _lerp(n, cs[i - 1], cs[i], _lerp(ctx, x0, x1, y0[j - 1], y0[j]),
                     _lerp(ctx, x0, x1, y1[j - 1], y1[j]))

    def cdec_each(self, seq_len: np.ndarray) -> np.ndarray:
        row = self.cdec_rows[0]
        return np.array([row(x) for x in seq_len.tolist()], dtype=np.float64)

    def beyond(self) -> int:
        """Lookups past a table's last grid point (extended linearly; NEO would assert)."""
        return sum(t.beyond for t in (self.lin_t, self.pref_t, self.gdec_t, *self.cdec_rows))


def profile(oracle: Predictor, block_size: int, max_tokens: int, max_batch: int,
            max_seq_len: int, gpu_tokens: int, cpu_tokens: int) -> TablePredictor:
    """NEO's profiling pass (`ModelProfiler.init_profile_tables`) on the hardware profile: each
    grid point is 'measured' as the batch NEO's profiler runs there, priced by the cost models
    as the simulator prices that batch in a forward (the in-situ factor of its width)."""
    gpu = oracle.gpu
    g = grids(block_size, max_tokens, max_batch, max_seq_len, gpu_tokens, cpu_tokens)
    zero = np.zeros(1, dtype=np.int64)
    # `_profile_linr` / `_profile_pref`: one prefill of S tokens
    lin = [gpu.dense_layer_us(s) * gpu.in_situ(s) for s in g["lin"]]
    pref = [float(gpu.prefill_attn(np.array([s]), zero)) * gpu.in_situ(s) for s in g["pref"]]
    # `_profile_gdec`: N tokens in sequences of max_seq_len (the last one shorter)
    gdec = []
    for n in g["gdec"]:
        b = -(-n // max_seq_len)
        gdec.append(float(gpu.decode_attn(b, n, min(n, max_seq_len))) * gpu.in_situ(b))
    # `_profile_cdec`: the aggregate N grid for every S; out-of-range entries filled after
    T = []
    for s, nl in zip(g["cdec_s"], g["cdec_n"]):
        row = []
        for n in g["cdec_agg"]:
            if n < nl[0]:
                row.append(0.0)
            elif n > nl[-1]:
                row.append(float("inf"))
            else:
                row.append(oracle.cdec(s, n))    # N tokens split evenly over S decodes
        T.append(row)
    _fill_cdec(T)
    tables = {"lin": Table1D(g["lin"], lin), "pref": Table1D(g["pref"], pref),
              "gdec": Table1D(g["gdec"], gdec), "cdec_s": g["cdec_s"],
              "cdec_rows": [Table1D(g["cdec_agg"], r) for r in T], "grid": g}
    return TablePredictor(oracle, tables)
