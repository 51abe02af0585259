"""Fitted latency functions as the cost model evaluates them (microseconds in, out).

Each is a plain value built from a profile's YAML mapping. Evaluation is vectorised numpy
(works on scalars and arrays). Outside the measured range a `Curve` extends along its last
knot's ratio y/x, i.e. along the roofline scaled by the last measured efficiency, and says so
once per curve in the log; it never goes flat.
"""
from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)

try:  # np.interp without its Python wrapper (the same compiled function)
    from numpy._core.multiarray import interp as _interp
except ImportError:  # pragma: no cover - older numpy
    _interp = np.interp


@dataclass(slots=True)
class Curve:
    """Monotone piecewise-linear y(x) on knots, proportional extension beyond the last knot."""

    name: str
    x: np.ndarray
    y: np.ndarray
    _warned: bool = field(default=False, repr=False)

    @classmethod
    def from_lists(cls, name: str, x, y) -> "Curve":
        xa = np.asarray(x, dtype=np.float64)
        ya = np.asarray(y, dtype=np.float64)
        if xa.ndim != 1 or xa.shape != ya.shape or len(xa) < 2:
            raise ValueError(f"{name}: need two equal-length lists of at least 2 knots")
        if np.any(np.diff(xa) <= 0):
            raise ValueError(f"{name}: knots must be strictly increasing")
        if np.any(ya < 0):
            raise ValueError(f"{name}: negative time in knots")
        # enforce monotone non-decreasing times (isotonic envelope of the knots)
        ya = np.maximum.accumulate(ya)
        return cls(name, xa, ya)

    @property
    def x_max(self) -> float:
        return float(self.x[-1])

    def __call__(self, x):
        xa = np.asarray(x, dtype=np.float64)
        out = np.interp(xa, self.x, self.y)
        beyond = xa > self.x[-1]
        if np.any(beyond):
            if not self._warned:
                log.info("%s: extending beyond the last knot x=%g along its roofline ratio",
                         self.name, self.x[-1])
                self._warned = True
            out = np.where(beyond, self.y[-1] * xa / self.x[-1], out)
        return out if out.ndim else float(out)

    def to_yaml(self) -> dict:
        return {"x": [float(v) for v in self.x], "us": [round(float(v), 4) for v in self.y]}


@dataclass(frozen=True, slots=True)
class Affine:
    """y = const + Σ coef_k · feature_k (non-negative coefficients)."""

    name: str
    const_us: float
    coefs: tuple[tuple[str, float], ...]

    @classmethod
    def from_mapping(cls, name: str, m: dict) -> "Affine":
        m = {k: v for k, v in m.items() if k not in ("source", "kind")}
        const = float(m.pop("const_us", 0.0))
        coefs = tuple((k, float(v)) for k, v in sorted(m.items()))
        if const < 0 or any(v < 0 for _, v in coefs):
            raise ValueError(f"{name}: coefficients must be non-negative")
        return cls(name, const, coefs)

    def coef(self, key: str) -> float:
        for k, v in self.coefs:
            if k == key:
                return v
        return 0.0

    def to_yaml(self) -> dict:
        d = {"const_us": round(self.const_us, 6)}
        d.update({k: float(f"{v:.6g}") for k, v in self.coefs})
        return d


@dataclass(slots=True)
class Grid:
    """t(x, y) on a rectangular grid of knots, bilinear in (log2 x, log2 y) of log t.

    Below the first knot of an axis the value is clamped; beyond the last it grows in
    proportion to that coordinate (the roofline ratio of the last knot), logged once.
    `y` may be an array when `x` is a scalar (event leaping evaluates many contexts at once).
    """

    name: str
    x_label: str
    y_label: str
    xs: np.ndarray
    ys: np.ndarray
    t: np.ndarray  # shape (len(xs), len(ys))
    _lx: np.ndarray = field(default=None, repr=False)
    _ly: np.ndarray = field(default=None, repr=False)
    _lt: np.ndarray = field(default=None, repr=False)
    _warned: bool = field(default=False, repr=False)
    _py: tuple = field(default=None, repr=False)
    _plans: dict = field(default=None, repr=False)
    _sx: dict = field(default=None, repr=False)  # scalar()'s work that depends on x alone
    _rows: dict = field(default=None, repr=False)  # row_plan()'s cache

    def __post_init__(self) -> None:
        self.xs = np.asarray(self.xs, dtype=np.float64)
        self.ys = np.asarray(self.ys, dtype=np.float64)
        self.t = np.asarray(self.t, dtype=np.float64)
        if self.t.shape != (len(self.xs), len(self.ys)) or len(self.xs) < 1 or len(self.ys) < 2:
            raise ValueError(f"{self.name}: grid shape {self.t.shape} does not match axes "
                             f"{len(self.xs)} x {len(self.ys)}")
        if np.any(np.diff(self.xs) <= 0) or np.any(np.diff(self.ys) <= 0):
            raise ValueError(f"{self.name}: grid axes must be strictly increasing")
        if np.any(self.t <= 0):
            raise ValueError(f"{self.name}: grid times must be positive")
        self._lx = np.log2(np.maximum(self.xs, 1.0))  # axes are counts; 0 sits at log2(1)
        self._ly = np.log2(np.maximum(self.ys, 1.0))
        self._lt = np.log(self.t)

    @classmethod
    def from_mapping(cls, name: str, m: dict) -> "Grid":
        return cls(name, m["x"], m["y"], m[m["x"]], m[m["y"]], m["us"])

    def to_yaml(self) -> dict:
        return {"x": self.x_label, "y": self.y_label,
                self.x_label: [float(v) for v in self.xs], self.y_label: [float(v) for v in self.ys],
                "us": [[float(f"{v:.6g}") for v in row] for row in self.t]}

    def _row(self, i: int, ya, lya):
        return np.interp(lya, self._ly, self._lt[i])

    def scalar(self, x: float, y: float) -> float:
        """The same function for one point in plain Python (no numpy call overhead); may
        differ from `__call__` in the last bit, so use one or the other for a quantity."""
        if self._py is None:
            self._py = (self._lx.tolist(), self._ly.tolist(), self._lt.tolist(),
                        (float(self.xs[0]), float(self.xs[-1]), float(self.ys[0]),
                         float(self.ys[-1])))
            self._sx = {}
        lxs, lys, lts, (xs0, xs1, ys0, ys1) = self._py
        px = self._sx.get(x)
        if px is None:  # the row and its weight, cached per x (batch sizes, chunk lengths)
            xc = min(max(x, xs0), xs1)
            lx = math.log2(max(xc, 1.0))
            i = min(max(bisect.bisect_right(lxs, lx) - 1, 0), len(lxs) - 1)
            px = (i, (lx - lxs[i]) / (lxs[i + 1] - lxs[i]) if i < len(lxs) - 1 else None)
            if len(self._sx) > 65536:
                self._sx.clear()
            self._sx[x] = px
        i, wx = px
        yc = min(max(y, ys0), ys1)
        ly = math.log2(max(yc, 1.0))
        j = min(max(bisect.bisect_right(lys, ly) - 1, 0), len(lys) - 2)
        wy = (ly - lys[j]) / (lys[j + 1] - lys[j])
        r0 = lts[i][j] + wy * (lts[i][j + 1] - lts[i][j])
        if wx is not None:
            r1 = lts[i + 1][j] + wy * (lts[i + 1][j + 1] - lts[i + 1][j])
            r0 = (1.0 - wx) * r0 + wx * r1
        out = math.exp(r0)
        if y > ys1:
            out *= y / ys1
        if x > xs1:
            out *= x / xs1
        return out

    def scalar_fn(self, per_x: bool = False, div: float = 1.0):
        """`scalar` as a closure with its per-knot differences precomputed: the same float
        operations on the same values (a difference or a weight's complement is computed once
        instead of per call), for loops that price thousands of points one by one. With
        `per_x` it is called with a total, `scalar(x, total / x) / div`."""
        if self._py is None:
            self.scalar(float(self.xs[0]), float(self.ys[0]))   # builds the plain lists
        lxs, lys, lts, (xs0, xs1, ys0, ys1) = self._py
        last_j = len(lys) - 2
        dly = [lys[j + 1] - lys[j] for j in range(last_j + 1)]
        # per row i: [(t[i][j], t[i][j + 1] - t[i][j]) for each j]
        seg = [[(row[j], row[j + 1] - row[j]) for j in range(last_j + 1)] for row in lts]
        rows: dict = {}
        log2, exp, bisect_right = math.log2, math.exp, bisect.bisect_right

        def f(x, y):
            if per_x:
                y = y / x
            r = rows.get(x)
            if r is None:  # as `scalar`: the row and its weight for this x
                xc = min(max(x, xs0), xs1)
                lx = log2(max(xc, 1.0))
                i = min(max(bisect_right(lxs, lx) - 1, 0), len(lxs) - 1)
                if i < len(lxs) - 1:
                    wx = (lx - lxs[i]) / (lxs[i + 1] - lxs[i])
                    r = (seg[i], seg[i + 1], 1.0 - wx, wx, x > xs1)
                else:
                    r = (seg[i], None, None, None, x > xs1)
                if len(rows) > 65536:
                    rows.clear()
                rows[x] = r
            s0, s1, a, wx, xbeyond = r
            # min(max(y, ys0), ys1) and the clamps below as comparisons (the same values)
            yc = y if y > ys0 else ys0
            if yc > ys1:
                yc = ys1
            ly = log2(yc if yc > 1.0 else 1.0)
            j = bisect_right(lys, ly) - 1
            if j < 0:
                j = 0
            elif j > last_j:
                j = last_j
            wy = (ly - lys[j]) / dly[j]
            t0, d0 = s0[j]
            r0 = t0 + wy * d0
            if s1 is not None:
                t1, d1 = s1[j]
                r0 = a * r0 + wx * (t1 + wy * d1)
            out = exp(r0)
            if y > ys1:
                out *= y / ys1
            if xbeyond:
                out *= x / xs1
            return out / div if per_x else out

        return f

    def x_plan(self, x):
        """`__call__`'s work that depends on x alone, cached: (row i, its weight 1 - w, the next
        row's weight w or None on the last row, x beyond the grid)."""
        plans = self._plans
        if plans is None:
            plans = self._plans = {}
        p = plans.get(x)
        if p is None:
            xf = float(x)
            xc = min(max(xf, self.xs[0]), self.xs[-1])
            lx = np.log2(max(xc, 1.0))
            i = int(np.searchsorted(self._lx, lx, side="right")) - 1
            i = min(max(i, 0), len(self.xs) - 1)
            if i == len(self.xs) - 1:
                p = (i, None, None, xf > self.xs[-1])
            else:
                w = (lx - self._lx[i]) / (self._lx[i + 1] - self._lx[i])
                p = (i, 1.0 - w, w, xf > self.xs[-1])
            plans[x] = p
        return p

    def row_plan(self, x):
        """`x_plan(x)` as the values its users compute with, cached: (row i's log times, the
        next row's or None, their weights as floats or None, x beyond the grid, the first and
        last y knots as floats). The same numbers, without numpy indexing per call."""
        rows = self._rows
        if rows is None:
            rows = self._rows = {}
        r = rows.get(x)
        if r is None:
            i, a, w, xbeyond = self.x_plan(x)
            lt = self._lt
            r = (lt[i], None if a is None else lt[i + 1], None if a is None else float(a),
                 None if a is None else float(w), xbeyond, float(self.ys[0]),
                 float(self.ys[-1]))
            rows[x] = r
        return r

    def at(self, x, y: float) -> float:
        """`float(__call__(x, y))` for one number y, with fewer numpy calls (the same floats)."""
        lt0, lt1, a, w, xbeyond, ys0, ys1 = self.row_plan(x)
        ya = y if y >= ys0 else ys0
        lya = np.log2(ya if ya >= 1.0 else 1.0)
        if a is None:
            out = np.exp(_interp(lya, self._ly, lt0))
        else:
            out = np.exp(a * _interp(lya, self._ly, lt0) + w * _interp(lya, self._ly, lt1))
        if ya > ys1 or xbeyond:
            if not self._warned:
                log.info("%s: extending beyond the grid along its roofline ratio", self.name)
                self._warned = True
            if ya > ys1:
                out = out * ya / ys1
            if xbeyond:
                out = out * float(x) / self.xs[-1]
        return float(out)

    def rising(self, x, y0: float, y: np.ndarray):
        """`__call__(x, y)` for a non-decreasing float64 array y whose first element is y0, in
        fewer numpy calls (the same floats: the same operations on the same values)."""
        i, a, w, xbeyond = self.x_plan(x)
        if xbeyond or y0 < self.ys[0] or y0 < 1.0 or y[-1] > self.ys[-1]:
            return self(x, y)  # clamping or extension: the general path
        lya = np.log2(y)
        if a is None:
            return np.exp(_interp(lya, self._ly, self._lt[i]))
        lt = _interp(lya, self._ly, self._lt[i])
        lt *= a
        r1 = _interp(lya, self._ly, self._lt[i + 1])
        r1 *= w
        lt += r1
        return np.exp(lt, out=lt)

    def __call__(self, x, y):
        xf = float(x)
        ya = np.maximum(np.asarray(y, dtype=np.float64), self.ys[0])
        lya = np.log2(np.maximum(ya, 1.0))
        xc = min(max(xf, self.xs[0]), self.xs[-1])
        lx = np.log2(max(xc, 1.0))
        i = int(np.searchsorted(self._lx, lx, side="right")) - 1
        i = min(max(i, 0), len(self.xs) - 1)
        if i == len(self.xs) - 1:
            lt = self._row(i, ya, lya)
        else:
            w = (lx - self._lx[i]) / (self._lx[i + 1] - self._lx[i])
            lt = (1.0 - w) * self._row(i, ya, lya) + w * self._row(i + 1, ya, lya)
        out = np.exp(lt)
        beyond_y = ya > self.ys[-1]
        if np.any(beyond_y) or xf > self.xs[-1]:
            if not self._warned:
                log.info("%s: extending beyond the grid along its roofline ratio", self.name)
                self._warned = True
            out = np.where(beyond_y, out * ya / self.ys[-1], out)
            if xf > self.xs[-1]:
                out = out * xf / self.xs[-1]
        return out if out.ndim else float(out)
