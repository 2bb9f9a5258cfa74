"""The summary page of the report: per source, the layer statistics and the strongest sinks."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

import pandas as pd

from .config import head_label
from .tables import resolve_step

_LAYER_COLUMNS = {
    "first": "first",
    "middle": "middle",
    "last": "last",
    "sink_score": "sink score",
    "first_middle_ratio": "first / middle",
    "argmax_frame": "argmax frame",
    "spread_pct": "spread %",
    "diagonal_mean": "diagonal mean",
    "first_column_mean": "frame-0 column mean",
}


def _at_step(stats: pd.DataFrame, step: str | int, metric: str) -> pd.DataFrame:
    rows = stats[stats["metric"] == metric]
    if rows.empty:
        return rows
    pass_, index = resolve_step(rows, step)
    return rows[(rows["pass"] == pass_) & (rows["step"] == index)]


def summary_html(layer_stats: pd.DataFrame, head_stats: pd.DataFrame, options: Mapping[str, Any]) -> str:
    """A self-contained HTML page; values are means over prompts and seeds."""
    step, metric = options["step"], options["metric"]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>sinkscope summary</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}"
        "caption{text-align:left;font-weight:bold}</style></head><body>",
        "<h1>Attention-sink summary</h1>",
        f"<p>The last block's query-averaged attention over key frames, metric <b>{html.escape(metric)}</b>, "
        f"call <b>{html.escape(str(step))}</b>; means over prompts and seeds. Layers and heads in paper notation "
        "(L1 = layer index 0). sink score = first key frame − mean of the middle key frames.</p>",
    ]
    for source, rows in layer_stats.groupby("checkpoint", sort=True):
        chosen = _at_step(rows, step, metric)
        if chosen.empty:
            continue
        # Means over prompts and seeds; the argmax frame is the most frequent one.
        how = {column: "mean" for column in _LAYER_COLUMNS} | {"argmax_frame": lambda s: s.mode().min()}
        table = chosen.groupby("layer").agg(how).rename(columns=_LAYER_COLUMNS)
        table.index = [f"L{layer + 1}" for layer in table.index]
        parts.append(f"<h2>{html.escape(str(source))}</h2>")
        parts.append("<h3>Head-averaged curve, per layer</h3>")
        parts.append(table.to_html(float_format=lambda v: f"{v:.4g}", na_rep="NaN", border=0))
        heads = _at_step(head_stats[head_stats["checkpoint"] == source], step, metric)
        if not heads.empty:
            per_head = heads.groupby(["layer", "head"])["sink_score"].mean().sort_values(ascending=False)
            top = per_head.head(10)
            listing = pd.DataFrame(
                {"head": [head_label(layer, head) for layer, head in top.index], "sink score": top.to_numpy()}
            )
            parts.append("<h3>Strongest sink heads</h3>")
            parts.append(listing.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0))
    parts.append("</body></html>")
    return "\n".join(parts)
