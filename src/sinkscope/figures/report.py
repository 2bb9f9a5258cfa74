"""The summary page of the report: per source, what the model is, the layer statistics,
the strongest sinks and the head classes.

Every number comes from the tables' run-averaged rows (``prompt_id == '*'``): the same
numbers the figures annotate (``sinkscope.stats.summaries``), never recomputed here.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from sinkscope.io import atomic_path
from sinkscope.naming import head_label, layer_label
from sinkscope.stats.summaries import HEAD_CLASSES, resolve_step
from sinkscope.tables import ALL_PROMPTS, read_table

_CURVE_COLUMNS = {
    "logit_mean": {"first": "first", "middle": "middle", "last": "last", "own": "own", "sink_score": "sink score",
                   "argmax_frame": "argmax frame", "diagonal_mean": "diagonal mean",
                   "first_column_mean": "frame-0 column mean"},
    "prob_mass": {"frame0_mass": "mass on frame 0", "first_k_mass": "mass on the first frames", "cache_share": "cache share",
                  "own_share": "own-block share", "first_middle_ratio": "first / middle", "sink_score": "sink score",
                  "argmax_frame": "argmax frame"},
}  # fmt: skip
_MODEL_NOTES = {
    "demo": (
        "The <b>random-weight demo</b> (<code>format: demo</code>): seeded random weights, so its attention is close "
        "to uniform and shows no sink by construction. Use the trained demo (the default config) to see what a trained "
        "block-causal model does, and README.md, 'Using the real models', for Self-Forcing."
    ),
    "trained_demo": (
        "The <b>trained demo</b>: the demo architecture trained on the project's synthetic videos "
        "(docs/trained-demo.md says how and what it learned). It is small and its data are simple: its attention "
        "patterns are its own, not those of Self-Forcing."
    ),
}


def _at_step(stats: pd.DataFrame, step: str | int, metric: str) -> pd.DataFrame:
    rows = stats[(stats["metric"] == metric) & (stats["prompt_id"] == ALL_PROMPTS)]
    if rows.empty:
        return rows
    pass_, index = resolve_step(rows, step)
    return rows[(rows["pass"] == pass_) & (rows["step"] == index)]


def _table_html(frame: pd.DataFrame) -> str:
    return frame.to_html(float_format=lambda v: f"{v:.4g}", na_rep="–", border=0)


def _model_note(source: str, layers: pd.DataFrame, checkpoints: Mapping[str, Mapping[str, Any]]) -> str:
    checkpoint = source.split("@")[0]
    entry = checkpoints.get(checkpoint, {})
    kind = "demo" if entry.get("format") == "demo" else ("trained_demo" if str(entry.get("weights", "")).startswith("sinkscope:") else None)
    parts = [_MODEL_NOTES[kind]] if kind else []
    mass = layers[layers["metric"] == "prob_mass"]
    if not mass.empty and mass["frame0_mass"].notna().any():
        frames = int(mass["num_key_frames"].max())
        parts.append(
            f"Measured here: {mass['frame0_mass'].min():.3f}-{mass['frame0_mass'].max():.3f} of the last block's softmax "
            f"mass on frame 0 across layers; a uniform spread over its {frames} key frames would give {1 / frames:.3f}."
        )
    return f"<p class='note'>{' '.join(parts)}</p>" if parts else ""


def summary_html(
    layer_stats: pd.DataFrame,
    head_stats: pd.DataFrame,
    head_diagnostics: pd.DataFrame,
    options: Mapping[str, Any],
) -> str:
    """A self-contained HTML page of the run-averaged statistics, per source."""
    step, metric = options["step"], options["metric"]
    checkpoints = options.get("checkpoints", {})
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>sinkscope summary</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}"
        ".note{background:#fff8e1;border-left:4px solid #f0b400;padding:.5em 1em}</style></head><body>",
        "<h1>Attention-sink summary</h1>",
        f"<p>The last block's queries, averaged over its frames and over every prompt and seed, against the key frames "
        f"they see (the Figure 4 view), call <b>{html.escape(str(step))}</b>. These are the rows with "
        "<code>prompt_id = '*'</code> of <code>layer_stats.parquet</code> / <code>head_stats.parquet</code>: the "
        "statistics of the run-averaged curve, the numbers the figures show. <i>first</i> / <i>last</i> are the oldest / "
        "newest cache frame before the block, <i>middle</i> the mean of those between, <i>own</i> the block's own frames; "
        "sink score = first − middle. Ratios and shares exist for softmax mass only. Layers and heads in paper notation "
        "(L1 = layer index 0).</p>",
    ]
    for source in sorted(set(layer_stats["checkpoint"] + "@" + layer_stats["variant"])):
        checkpoint, variant = source.split("@", 1)
        name = checkpoint if variant == "default" else source
        rows = layer_stats[(layer_stats["checkpoint"] == checkpoint) & (layer_stats["variant"] == variant)]
        parts.append(f"<h2>{html.escape(name)}</h2>")
        chosen = {m: _at_step(rows, step, m) for m in _CURVE_COLUMNS}
        if chosen[metric].empty:
            parts.append("<p>No rows for this call.</p>")
            continue
        parts.append(_model_note(name, chosen["prob_mass"], checkpoints))
        runs = int(chosen[metric]["runs"].max())
        for label, key in (("Pre-softmax logits (mean q·k/√d)", "logit_mean"), ("Softmax mass", "prob_mass")):
            table = chosen[key].set_index("layer")[list(_CURVE_COLUMNS[key])].rename(columns=_CURVE_COLUMNS[key])
            table.index = [layer_label(layer) for layer in table.index]
            parts.append(f"<h3>{label}, head-averaged, per layer (mean curve of {runs} run{'s' * (runs != 1)})</h3>")
            parts.append(_table_html(table))
        heads = _at_step(head_stats[(head_stats["checkpoint"] == checkpoint) & (head_stats["variant"] == variant)], step, metric)
        if not heads.empty:
            top = heads.sort_values("sink_score", ascending=False).head(10)
            listing = pd.DataFrame({"head": [head_label(r.layer, r.head) for r in top.itertuples()],
                                    "sink score": top["sink_score"].to_numpy(), "first": top["first"].to_numpy(),
                                    "middle": top["middle"].to_numpy()})  # fmt: skip
            parts.append(f"<h3>Strongest sink heads ({html.escape(metric)})</h3>")
            parts.append(listing.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0))
        diagnostics = head_diagnostics[(head_diagnostics["checkpoint"] == checkpoint) & (head_diagnostics["variant"] == variant)]
        if not diagnostics.empty:
            pass_, index = resolve_step(diagnostics, step)
            chosen_calls = diagnostics[(diagnostics["pass"] == pass_) & (diagnostics["step"] == index)]
            counts = chosen_calls["head_class"].value_counts().reindex(list(HEAD_CLASSES), fill_value=0)
            parts.append("<h3>Head classes</h3><p>" + ", ".join(f"{k}: {v}" for k, v in counts.items())
                         + " (thresholds: config <code>diagnostics:</code>, docs/statistics.md)</p>")  # fmt: skip
    parts.append("</body></html>")
    return "\n".join(parts)


def summary_job(
    layer_stats_path: str | Path,
    head_stats_path: str | Path,
    head_diagnostics_path: str | Path,
    output: str | Path,
    options: Mapping[str, Any],
) -> None:
    """The pipeline's job: the summary page from the combined tables."""
    html_text = summary_html(read_table(layer_stats_path), read_table(head_stats_path), read_table(head_diagnostics_path), options)
    with atomic_path(output) as tmp:
        tmp.write_text(html_text)
