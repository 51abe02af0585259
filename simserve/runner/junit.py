"""The regression check as a JUnit XML report: CI systems (GitHub Actions reporters, GitLab,
Jenkins) list each test case, so the curve that moved is named in the pull request.

One test suite per experiment; one test case per (policy curve, metric), failed when any of
that curve's points (or its sustainable rate) moved beyond tolerance, the failure message
listing each moved point with baseline, now and change."""
from __future__ import annotations

import math
import os
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from simserve.paths import umask_mode


def _case_key(row) -> tuple[str, str]:
    """(policy curve, metric) of a comparison row: `where` is 'policy @ rate, seed' for a
    point and the policy for a sustainable rate."""
    return row.where.split(" @ ")[0], row.what


def _line(row) -> str:
    ch = "inf" if math.isinf(row.rel) else f"{row.rel * 100:+.2f}%"
    return (f"{row.what} at {row.where}: baseline {row.baseline:.6g}, now {row.now:.6g} "
            f"({ch}; tolerance {max(row.tol, 0) * 100:.0f}%)")


def junit_tree(folder: Path, cases) -> ET.Element:
    """`cases`: (experiment, comparison rows, reason when there was nothing to compare)."""
    root = ET.Element("testsuites", name=f"simserve regress {folder}")
    for experiment, rows, missing in cases:
        suite = ET.SubElement(root, "testsuite", name=experiment)
        groups: dict[tuple[str, str], list] = {}
        for r in rows:
            groups.setdefault(_case_key(r), []).append(r)
        if missing:
            case = ET.SubElement(suite, "testcase", classname=experiment, name="baseline")
            ET.SubElement(case, "failure", message=missing).text = missing
        for (curve, metric), rs in groups.items():
            case = ET.SubElement(suite, "testcase", classname=f"{experiment}.{curve}",
                                 name=metric)
            moved = [r for r in rs if r.changed]
            if moved:
                msg = f"{len(moved)} of {len(rs)} comparisons moved beyond tolerance"
                ET.SubElement(case, "failure", message=msg).text = \
                    "\n".join(_line(r) for r in moved)
        n = len(suite.findall("testcase"))
        failed = len(suite.findall("testcase/failure"))
        suite.set("tests", str(n))
        suite.set("failures", str(failed))
        suite.set("errors", "0")
    root.set("tests", str(len(root.findall("testsuite/testcase"))))
    root.set("failures", str(len(root.findall("testsuite/testcase/failure"))))
    return root


def write_junit(path: Path, folder: Path, cases) -> None:
    """Atomically: a CI step that reads the file never sees half of it."""
    tree = ET.ElementTree(junit_tree(folder, cases))
    ET.indent(tree)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.resolve().parent)
    with os.fdopen(fd, "wb") as f:
        tree.write(f, encoding="utf-8", xml_declaration=True)
    os.chmod(tmp, umask_mode())  # mkstemp made it 0600
    os.replace(tmp, path)
