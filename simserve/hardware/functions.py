"""Fitted latency functions as the cost model evaluates them (microseconds in, out).

Each is a plain value built from a profile's YAML mapping. Evaluation is vectorised numpy
(works on scalars and arrays). Outside the measured range a `Curve` extends along its last
knot's ratio y/x, i.e. along the roofline scaled by the last measured efficiency, and says so
once per curve in the log; it never goes flat.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)


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
        m = dict(m)
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
