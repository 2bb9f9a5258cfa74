"""What the speed benchmarks share in writing their results (no sinkscope import, so that a
driver of another project's code, ``longlive2_theirs.py``, uses it too)."""

from __future__ import annotations

import json
import traceback
from pathlib import Path


def error_entry(error: BaseException) -> dict:
    """A failed measurement's entry: the error in one line and the end of its traceback."""
    return {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-2000:]}


def write_results(results: dict, out: str | Path, *, partial: bool = False) -> int:
    """Write ``results.json`` into the folder ``out`` and print it (``partial``: write only,
    so that a run cut off by a time limit leaves the rows it finished); the exit status: 1
    when an entry failed (``error_entry``), else 0."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results, indent=1))
    if not partial:
        print(json.dumps(results, indent=1))
    return 1 if any(isinstance(row, dict) and "error" in row for row in results.values()) else 0
