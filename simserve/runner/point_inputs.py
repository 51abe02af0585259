"""What a simulated point is made from besides its config and trace: the source of the simserve
modules its simulation imports, the data files those read, and the hardware profiles it uses
(`point_code_hash`). A stored point is stale when this hash changes, and only then: an edit to
the planner, `explain/` or another policy leaves it fresh; an edit to a module the simulation
imports (directly or through others), or to a profile it reads, makes it stale.

The modules are the import closure (`parsed_cache.closure_sources`) of the point's entry
(`sweep_task`, which reaches `run_point` and the whole simulation core) and of each of its
policies' modules (imported by name at run time, so not reached from the entry), with the
`.pxd` type declarations beside them (they change what the compiled modules compute). The
profiles are the hardware's (GPU, PCIe, NVLink, CPU) and those a policy option names (an option
ending in `_gpu`, `_cpu` or `_link`, e.g. distserve's `decode_gpu` and `handoff_link`).
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

ENTRY = "simserve.runner.sweep_task"   # a point's simulation: `simulate_one` -> `run_point`
# package data folders (`paths.data_dir`) read by a module, hashed when the module is in the
# closure (a test checks that every module calling `data_dir` is listed or exempt)
DATA_READERS = {"simserve.accuracy": "accuracy", "simserve.workload.manifest": "traces",
                "simserve.plan.prices": "prices", "simserve.realcheck.accuracy_fit": "accuracy"}
PROFILE_OPTION_SUFFIXES = ("_gpu", "_cpu", "_link")
_DATA_SUFFIXES = (".yaml", ".yml", ".json", ".csv")


def policy_modules(name: str) -> tuple[str, ...]:
    """The modules defining policy `name`'s build function and config class."""
    from simserve.policies import get_policy
    cls, build = get_policy(name)
    return tuple(sorted({build.__module__, cls.__module__}))


@functools.lru_cache(maxsize=64)
def modules_hash(roots: tuple[str, ...]) -> str:
    """sha256 over the sources (and `.pxd` files) of the import closures of `roots`, and the
    package data folders the modules in them read."""
    from simserve.parsed_cache import closure_sources
    from simserve.paths import data_dir
    files: dict[str, tuple[Path | None, bytes]] = {}
    for root in roots:
        for mod, path, src in closure_sources(root):
            files[mod] = (path, src)
    h = hashlib.sha256()
    for mod in sorted(files):
        path, src = files[mod]
        h.update(mod.encode() + b"\0" + src + b"\0")
        pxd = path.with_suffix(".pxd") if path is not None else None
        if pxd is not None and pxd.is_file():
            h.update(b"pxd\0" + pxd.read_bytes() + b"\0")
    for folder in sorted({d for m, d in DATA_READERS.items() if m in files}):
        base = data_dir(folder)
        for p in sorted(base.rglob("*")) if base.is_dir() else ():
            if p.suffix in _DATA_SUFFIXES and p.is_file():
                h.update(p.relative_to(base).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def profile_names(cfg) -> list[str]:
    """The hardware profiles a point reads: its hardware's and those its policies' options
    name (`PROFILE_OPTION_SUFFIXES`)."""
    import dataclasses
    hw = cfg.hardware
    names = [hw.gpu, hw.pcie, hw.nvlink, hw.cpu]
    for p in cfg.policies:
        for f in dataclasses.fields(p.config):
            v = getattr(p.config, f.name)
            if f.name.endswith(PROFILE_OPTION_SUFFIXES) and isinstance(v, str) and v:
                names.append(v)
    return [n for n in names if n]


def profile_paths(cfg) -> list[Path]:
    """The files of `profile_names(cfg)` and of the links a GPU profile names for itself."""
    from simserve.errors import ConfigError
    from simserve.hardware.profile import load_profile
    out = []
    for name in profile_names(cfg):
        try:
            prof = load_profile(name)
        except ConfigError:
            continue  # the point's validation reports it
        out.append(Path(prof.path))
        for link in ("pcie", "nvlink"):
            if prof.spec.get(link):
                try:
                    out.append(Path(load_profile(prof.spec[link]).path))
                except ConfigError:
                    continue
    return sorted(set(out))


def point_code_hash(cfg) -> str:
    """sha256[:16] over what a point of `cfg` is simulated with besides its config and traces:
    the modules its simulation imports (with its policies'), the package data they read and
    the hardware profiles it uses."""
    from simserve.runner.provenance import file_sha256
    roots = (ENTRY,) + tuple(m for p in cfg.policies for m in policy_modules(p.name))
    h = hashlib.sha256(modules_hash(tuple(sorted(set(roots)))).encode())
    for path in profile_paths(cfg):
        h.update(f"\0{path.name}\0{file_sha256(path)}".encode())
    return h.hexdigest()[:16]
