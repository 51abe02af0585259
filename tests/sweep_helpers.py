"""What the sweep and executor tests share: the CLI call, the output tree, a pinned date."""
from __future__ import annotations

from pathlib import Path

import pytest

from simserve.cli import main


def sweep(args) -> int:
    return main(["sweep", *map(str, args), "-q"])


def tree(out: Path) -> dict[str, bytes]:
    """Every file under `out`, by relative path."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module", autouse=True)
def pinned_date():
    """Records carry the date they ran; pinned so that reruns compare byte for byte (a module
    that imports this fixture gets it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SOURCE_DATE_EPOCH", "1700000000")
        yield
