"""The hardware an experiment names, resolved to profiles."""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

from simserve.errors import ConfigError
from simserve.hardware.profile import HardwareProfile, load_profile


@dataclass(frozen=True, slots=True)
class HardwareConfig:
    """`hardware:` in an experiment. Links default to what the GPU's spec names."""

    gpu: str = "h100-sxm"
    num_gpus: int = 1
    pcie: str | None = None
    nvlink: str | None = None
    cpu: str | None = None
    cpu_cores: int | None = None

    def validate(self) -> None:
        if not isinstance(self.num_gpus, int) or self.num_gpus < 1:
            raise ValueError(f"num_gpus: expected a positive integer, got {self.num_gpus!r}")
        if self.cpu_cores is not None and (not isinstance(self.cpu_cores, int) or self.cpu_cores < 1):
            raise ValueError(f"cpu_cores: expected a positive integer, got {self.cpu_cores!r}")


@dataclass(frozen=True)
class Hardware:
    gpu: HardwareProfile
    num_gpus: int
    pcie: HardwareProfile
    nvlink: HardwareProfile | None
    cpu: HardwareProfile | None
    cpu_cores: int | None

    @property
    def gpu_memory_bytes(self) -> float:
        return float(self.gpu.spec["memory_gib"]) * 2**30


def resolve_hardware(cfg: HardwareConfig, where: str = "hardware") -> Hardware:
    gpu = _load(cfg.gpu, "gpu", f"{where}.gpu")
    pcie_name = cfg.pcie or gpu.spec.get("pcie")
    if not pcie_name:
        raise ConfigError(f"{where}.pcie: GPU profile {gpu.name!r} names no PCIe link; set one")
    pcie = _load(pcie_name, "link", f"{where}.pcie")
    nv_name = cfg.nvlink or gpu.spec.get("nvlink")
    nvlink = _load(nv_name, "link", f"{where}.nvlink") if nv_name else None
    if cfg.num_gpus > 1 and nvlink is None:
        raise ConfigError(f"{where}.nvlink: {cfg.num_gpus} GPUs of {gpu.name!r} need a GPU-GPU "
                          "link profile (this GPU has no NVLink; name one explicitly)")
    cpu = _load(cfg.cpu, "cpu", f"{where}.cpu") if cfg.cpu else None
    return Hardware(gpu, cfg.num_gpus, pcie, nvlink, cpu, cfg.cpu_cores)


def _load(name: str, kind: str, where: str) -> HardwareProfile:
    try:
        return load_profile(name, expect_kind=kind)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def profiles_digest(cfg: HardwareConfig) -> str:
    """sha256[:16] over the files of the profiles `cfg` resolves to (GPU, links, CPU): part of
    a point's cache key, so results simulated before a profile was refitted are not reused.
    Hardware that does not resolve hashes as "unresolved" (its validation reports the error)."""
    try:
        hw = resolve_hardware(cfg)
    except ConfigError:
        return "unresolved"
    h = hashlib.sha256()
    for p in (hw.gpu, hw.pcie, hw.nvlink, hw.cpu):
        if p is not None:
            st = Path(p.path).stat()
            h.update(_file_digest(str(p.path), st.st_mtime_ns, st.st_size).encode())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=64)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
