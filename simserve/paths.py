"""Where simserve's files are: the data shipped inside the package, the user's folders, and
the repository checkout (when simserve runs from one).

Shipped (package data, read through `importlib.resources`, so they work from a wheel):
    simserve/data/hwprofiles/*.yaml     hardware profiles
    simserve/data/traces/manifest.yaml  named public traces (where to fetch them)
    simserve/data/experiments/*.yaml    experiments runnable by name (`simserve run quickstart`)

User folders (searched before the shipped profiles, earlier wins):
    $SIMSERVE_PROFILE_DIR (one path, or several joined by os.pathsep)
    $XDG_CONFIG_HOME/simserve/hwprofiles (default ~/.config/simserve/hwprofiles): where
        `simserve calibrate fit` and `derive`/`rescale` write when not run from a checkout
    $XDG_CACHE_HOME/simserve/hwprofiles (default ~/.cache/simserve/hwprofiles)

Raw calibration points (`hwprofiles/raw/`) and validation measurements stay in the repository;
nothing in a simulation reads them.
"""
from __future__ import annotations

import atexit
import os
from contextlib import ExitStack
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent  # meaningful only when `in_checkout()`
_STACK: ExitStack | None = None


def in_checkout() -> bool:
    """True when simserve runs from a source checkout (not an installed wheel)."""
    return (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "hwprofiles").is_dir()


def data_dir(*parts: str) -> Path:
    """A folder of the package data as a real path (extracted once if the package is zipped)."""
    global _STACK
    from importlib.resources import as_file, files
    res = files("simserve").joinpath("data", *parts)
    if isinstance(res, Path):
        return res
    if _STACK is None:
        _STACK = ExitStack()
        atexit.register(_STACK.close)
    return Path(_STACK.enter_context(as_file(res)))


def _xdg(var: str, default: str) -> Path:
    base = os.environ.get(var) or str(Path.home() / default)
    return Path(base).expanduser() / "simserve"


def config_dir() -> Path:
    return _xdg("XDG_CONFIG_HOME", ".config")


def cache_dir() -> Path:
    return _xdg("XDG_CACHE_HOME", ".cache")


def shipped_profile_dir() -> Path:
    return data_dir("hwprofiles")


def user_profile_dirs() -> list[Path]:
    """$SIMSERVE_PROFILE_DIR entries, then the config and cache folders (see the docstring)."""
    dirs = [Path(p).expanduser() for p in os.environ.get("SIMSERVE_PROFILE_DIR", "")
            .split(os.pathsep) if p]
    return dirs + [config_dir() / "hwprofiles", cache_dir() / "hwprofiles"]


def profile_write_dir() -> Path:
    """Default output of `simserve calibrate fit` and the derive/rescale tools: the package's
    profile folder in a checkout (committed with the code), else the user's config folder."""
    return shipped_profile_dir() if in_checkout() else config_dir() / "hwprofiles"


def umask_mode(bits: int = 0o666) -> int:
    """`bits` under the process umask: what open() gives a new file (tempfile.mkstemp makes
    0600 files; chmod a temporary file to this before renaming it into place)."""
    mask = os.umask(0)
    os.umask(mask)
    return bits & ~mask


def shipped_experiments() -> dict[str, Path]:
    d = data_dir("experiments")
    return {p.stem: p for p in sorted(d.glob("*.yaml"))} if d.is_dir() else {}
