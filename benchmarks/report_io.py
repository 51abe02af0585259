"""What every benchmark script does with its report: print it, and with `--out` write it there
too (the measurements kept under `benchmarks/results/`)."""
from __future__ import annotations

from pathlib import Path


def emit(lines: list[str], out: str | None = None) -> None:
    """Print `lines` as one text; with `out`, also write that text to the file `out`."""
    text = "\n".join(lines)
    print(text)
    if out:
        Path(out).write_text(text + "\n")
