"""Published per-head label files: reading them, and the label codes of Pyramid Forcing.

A label file is a CSV of one row per layer and one column per head (no header; ``#``
lines are comments), each cell one of the codes of ``PYRAMID_LABELS``: the layout of
Pyramid Forcing's ``configs/head_configs/best_labels.csv`` (30 x 12 for Self-Forcing's
Wan2.1-T2V-1.3B). Standard library only: the config check reads it while the Snakefile
parses. The study's own labels are ``head_diagnostics.pyramid_label``
(``sinkscope.stats.summaries``); the agreement tables are ``sinkscope.stats.labels``.
"""

from __future__ import annotations

import csv
from pathlib import Path

from sinkscope.errors import SinkscopeError

# Code -> (Pyramid Forcing's head type, what their repository calls it).
PYRAMID_LABELS: dict[int, tuple[str, str]] = {
    -1: ("wave", "oscillating"),
    1: ("anchor", "stable (compact)"),
    2: ("veil", "stable-sparse"),
}


def label_name(code: int) -> str:
    """'wave (-1)', 'anchor (1)', 'veil (2)'."""
    return f"{PYRAMID_LABELS[int(code)][0]} ({int(code)})"


def read_label_file(path: str | Path, layers: int | None = None, heads: int | None = None) -> list[list[int]]:
    """The file's labels, ``labels[layer][head]`` (0-based); a one-line ``SinkscopeError``
    naming the file and the bad cell (1-based row and column) when a cell is not a code,
    a row is short or long, or the shape is not ``layers`` x ``heads`` (when given)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        raise SinkscopeError(f"label file {path}: cannot be read ({error.__class__.__name__})") from None
    rows: list[list[int]] = []
    width = None
    lines = [
        (number, line)
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    for number, cells in zip((n for n, _ in lines), csv.reader(line for _, line in lines)):
        codes = []
        for column, cell in enumerate(cells, 1):
            try:
                code = int(cell.strip())
            except ValueError:
                code = None
            if code not in PYRAMID_LABELS:
                known = ", ".join(str(c) for c in PYRAMID_LABELS)
                raise SinkscopeError(
                    f"label file {path}: line {number}, column {column}: {cell.strip()!r} is not one of {known}"
                )
            codes.append(code)
        if width is not None and len(codes) != width:
            raise SinkscopeError(f"label file {path}: line {number} has {len(codes)} columns, the first row {width}")
        width = len(codes)
        rows.append(codes)
    if not rows:
        raise SinkscopeError(f"label file {path}: no rows")
    if layers is not None and len(rows) != layers or heads is not None and width != heads:
        want = f"{layers if layers is not None else len(rows)} x {heads if heads is not None else width}"
        raise SinkscopeError(f"label file {path}: {len(rows)} rows x {width} columns, expected {want} (layers x heads)")
    return rows
