"""Price tables: what an hour of a GPU, a host CPU core and a GiB of host memory costs.

Shipped tables live in `simserve/data/prices/NAME.yaml`, each number with its source and date.
A plan names one (`prices: on-demand-2026`), a file of the same form, or a mapping that names a
`file` (default: the shipped table) and overrides entries: `{gpu_hour: {h20: 1.8}}` or the full
form `{gpu_hour: {h20: {usd: 1.8, source: my quote, date: 2026-12-01}}}`."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from simserve.errors import ConfigError, did_you_mean

DEFAULT = "on-demand-2026"
KEYS = ("name", "currency", "gpu_hour", "cpu_core_hour", "host_memory_gib_hour", "file")


@dataclass(frozen=True)
class Price:
    usd: float
    source: str
    date: str


@dataclass(frozen=True)
class PriceTable:
    name: str
    gpu_hour: dict            # GPU profile name -> Price
    cpu_core_hour: Price
    host_memory_gib_hour: Price

    def gpu(self, name: str, where: str = "prices") -> Price:
        if name not in self.gpu_hour:
            raise ConfigError(f"{where}: no GPU-hour price for {name!r}"
                              f"{did_you_mean(name, self.gpu_hour)}; add gpu_hour: "
                              f"{{{name}: USD}} to the plan's prices")
        return self.gpu_hour[name]

    def hourly(self, gpu: str, num_gpus: int, cpu_cores: int = 0,
               host_gib: float = 0.0) -> float:
        """USD per hour: the GPUs, plus the cores and host memory a CPU tier adds."""
        return (self.gpu(gpu).usd * num_gpus + self.cpu_core_hour.usd * cpu_cores
                + self.host_memory_gib_hour.usd * host_gib)

    def sources(self) -> list[str]:
        rows = [(f"gpu {k}", v) for k, v in self.gpu_hour.items()]
        rows += [("cpu core", self.cpu_core_hour), ("host GiB", self.host_memory_gib_hour)]
        return [f"{k}: ${p.usd:g}/h ({p.source}; {p.date})" for k, p in rows]


def shipped() -> dict[str, Path]:
    from simserve.paths import data_dir
    return {p.stem: p for p in sorted(data_dir("prices").glob("*.yaml"))}


def _price(v, where: str) -> Price:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = {"usd": v, "source": "given in the plan", "date": "-"}
    if not isinstance(v, dict) or "usd" not in v:
        raise ConfigError(f"{where}: expected a number of USD or {{usd, source, date}}, got {v!r}")
    usd = v["usd"]
    if isinstance(usd, bool) or not isinstance(usd, (int, float)) or usd < 0:
        raise ConfigError(f"{where}.usd: expected a non-negative number, got {usd!r}")
    return Price(float(usd), str(v.get("source", "given in the plan")), str(v.get("date", "-")))


def _read(name_or_path: str, where: str) -> dict:
    table = shipped()
    p = table.get(str(name_or_path)) or Path(str(name_or_path))
    if not p.is_file():
        raise ConfigError(f"{where}: {name_or_path!r} is neither a shipped price table "
                          f"({', '.join(table)}) nor a file")
    try:
        return yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None


def load_prices(spec=DEFAULT, where: str = "prices", base: Path | None = None) -> PriceTable:
    """A table from a shipped name, a file (relative to `base`), or a mapping of overrides."""
    over: dict = {}
    if isinstance(spec, dict):
        over = dict(spec)
        for k in over:
            if k not in KEYS:
                raise ConfigError(f"{where}.{k}: unknown key{did_you_mean(k, KEYS)}; allowed: "
                                  f"{', '.join(KEYS)}")
        spec = over.pop("file", DEFAULT)
    if base is not None and str(spec) not in shipped() and not Path(str(spec)).is_absolute():
        spec = str(base / str(spec))
    data = _read(spec, where)
    gpus = {k: _price(v, f"{spec}: gpu_hour.{k}") for k, v in (data.get("gpu_hour") or {}).items()}
    for k, v in (over.get("gpu_hour") or {}).items():
        gpus[k] = _price(v, f"{where}.gpu_hour.{k}")
    pick = {}
    for k in ("cpu_core_hour", "host_memory_gib_hour"):
        v = over.get(k, data.get(k))
        if v is None:
            raise ConfigError(f"{where}: the price table {spec} has no {k}")
        pick[k] = _price(v, f"{where}.{k}")
    return PriceTable(str(data.get("name", spec)), gpus, pick["cpu_core_hour"],
                      pick["host_memory_gib_hour"])
