"""Layering of the package, read from the source with `ast` (top-level and function-level
imports alike): the SimPy core imports nothing above it, and no two packages import each other
(directly or around a longer loop)."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "simserve"
SIM_ALLOWED = {"simserve.sim", "simserve.errors", "numpy", "simpy"}
# third-party, not a layer: `Recorder.frame()` builds its DataFrame on request (lazy import)
SIM_LAZY = {"pandas"}
# the specs the core is handed may be named in type hints (under `if TYPE_CHECKING:` only)
SIM_TYPE_ONLY = {"simserve.hardware.profile", "simserve.hardware.setup", "simserve.models",
                 "simserve.workload.spec"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking_nodes(tree) -> set[int]:
    """ids of the import nodes inside `if TYPE_CHECKING:` blocks (never executed)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for b in node.body for n in ast.walk(b))
    return out


def _imports(name: str, path: Path, modules, type_only: bool | None = None,
             top_level: bool | None = None) -> set[str]:
    """Absolute names of every module `path` imports, at any depth of the file. `type_only`:
    None all, True only those under `if TYPE_CHECKING:`, False only those that run.
    `top_level`: None all, True only module-level statements, False only inside functions."""
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    guarded = _type_checking_nodes(tree)
    in_functions = {id(n) for f in ast.walk(tree)
                    if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)}
    found = set()
    for node in ast.walk(tree):
        if type_only is not None and (id(node) in guarded) != type_only:
            continue
        if top_level is not None and (id(node) in in_functions) == top_level:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[:len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            found.add(mod)
            for a in node.names:  # `from simserve import plots` imports simserve.plots
                if f"{mod}.{a.name}" in modules:
                    found.add(f"{mod}.{a.name}")
    return found


def _package(mod: str) -> str:
    """The layer a module belongs to: `simserve.cost.gpu` -> `simserve.cost`."""
    return ".".join(mod.split(".")[:2])


def _within(mod: str, roots) -> bool:
    return any(mod == r or mod.startswith(r + ".") for r in roots)


def test_the_sim_core_imports_nothing_above_it():
    modules = _modules()
    bad = []
    for name, path in modules.items():
        if not _within(name, ["simserve.sim"]):
            continue
        lazy = _imports(name, path, modules, top_level=False)
        for type_only, allowed in ((False, SIM_ALLOWED), (True, SIM_ALLOWED | SIM_TYPE_ONLY)):
            for mod in _imports(name, path, modules, type_only):
                if _within(mod, SIM_LAZY) and mod in lazy:
                    continue
                top = mod.split(".")[0]
                if top != "simserve" and (top in sys.stdlib_module_names or top == "__future__"):
                    continue
                if not _within(mod, allowed):
                    bad.append(f"{path.relative_to(PKG.parent)} imports {mod}")
    assert not bad, "\n".join(bad)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        src = _package(name)
        for mod in _imports(name, path, modules):
            if not _within(mod, ["simserve"]) or mod == "simserve":
                continue
            dst = _package(mod)
            if dst != src and src != "simserve":  # the root package's lazy facade is exempt
                graph.setdefault(src, set()).add(dst)
    return graph


def _cycle(graph) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        state[n] = 2
        stack.pop()
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_no_import_cycle_between_packages():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_cycle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycle(g) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("src", ["from simserve.policies import get_policy\n",
                                 "def f():\n    from simserve.runner import config\n",
                                 "if TYPE_CHECKING:\n    from simserve.policies import get_policy\n"])
def test_an_upward_import_in_the_sim_core_is_seen(tmp_path, src):
    p = tmp_path / "x.py"
    p.write_text(src)
    mods = _imports("simserve.sim.x", p, _modules())
    assert any(not _within(m, SIM_ALLOWED | SIM_TYPE_ONLY) for m in mods)
