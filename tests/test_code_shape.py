"""Shape of the source under `simserve/`, read with `ast`: no module above 500 lines and no
function (or method, or nested function) above 80 lines, except the entries of the allow-lists
below, each capped at its size when it was listed."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "simserve"
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80

# Known offenders, waiting to be split. These lists may only shrink: never add an entry or raise
# a cap; when a split brings an entry under the limit, delete it (the test says so).
FILE_ALLOW: dict[str, int] = {  # path under simserve/ -> lines at most
}
FUNCTION_ALLOW = {  # "path::qualified name" -> lines at most
    "realcheck/cli.py::register": 86,
    "realcheck/vllm_probe.py::_instrument_core": 123,
}


def file_lines(text: str) -> int:
    return len(text.splitlines())


def function_lengths(text: str, filename: str = "<src>") -> dict[str, int]:
    """Lines from `def` to the last line of the body, for every function at any depth, keyed by
    its qualified name (Class.method, outer.inner)."""
    out: dict[str, int] = {}

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out[name] = max(out.get(name, 0), child.end_lineno - child.lineno + 1)
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(text, filename), "")
    return out


def measure(root: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(module lines by path, function lines by "path::name") for every .py file under root."""
    files, functions = {}, {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        files[rel] = file_lines(text)
        for name, n in function_lengths(text, str(path)).items():
            functions[f"{rel}::{name}"] = n
    return files, functions


def violations(sizes: dict[str, int], limit: int, allow: dict[str, int]) -> list[str]:
    out = []
    for key, n in sorted(sizes.items()):
        if key in allow:
            if n > allow[key]:
                out.append(f"{key}: {n} lines, more than its allow-list cap of {allow[key]}")
        elif n > limit:
            out.append(f"{key}: {n} lines (limit {limit})")
    for key, cap in sorted(allow.items()):
        if key not in sizes:
            out.append(f"{key}: allow-listed but gone; delete the entry")
        elif sizes[key] <= limit:
            out.append(f"{key}: {sizes[key]} lines, within the limit now; delete the entry")
    return out


@pytest.fixture(scope="module")
def measured():
    return measure(PKG)


def test_no_module_above_500_lines(measured):
    files, _ = measured
    assert files, "found no Python source under simserve/"
    assert violations(files, MAX_FILE_LINES, FILE_ALLOW) == []


def test_no_function_above_80_lines(measured):
    _, functions = measured
    assert functions
    assert violations(functions, MAX_FUNCTION_LINES, FUNCTION_ALLOW) == []


def test_the_scan_sees_long_functions_and_files(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(85))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        f"class A:\n    def short(self):\n        return 1\n\n    def long(self):\n"
        f"    {body.replace(chr(10), chr(10) + '    ')}\n\n\n"
        f"def outer():\n    def inner():\n{'    ' + body.replace(chr(10), chr(10) + '    ')}\n"
        f"    return inner\n" + "\n" * 400)
    files, functions = measure(tmp_path)
    assert files["pkg/m.py"] > MAX_FILE_LINES
    assert functions["pkg/m.py::A.short"] == 2
    assert functions["pkg/m.py::A.long"] == 86
    assert functions["pkg/m.py::outer.inner"] == 86
    assert functions["pkg/m.py::outer"] == 88
    assert violations(functions, MAX_FUNCTION_LINES, {}) == [
        "pkg/m.py::A.long: 86 lines (limit 80)", "pkg/m.py::outer: 88 lines (limit 80)",
        "pkg/m.py::outer.inner: 86 lines (limit 80)"]
    # an allow-listed entry may not grow past its cap, and must go once it fits
    assert violations({"f::g": 90}, 80, {"f::g": 89}) == ["f::g: 90 lines, more than its "
                                                          "allow-list cap of 89"]
    assert violations({"f::g": 70}, 80, {"f::g": 89}) == ["f::g: 70 lines, within the limit "
                                                          "now; delete the entry"]
