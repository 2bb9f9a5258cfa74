"""The summary page of the report: which model, then per source the layer statistics,
the sink-class heads (or that there are none), the heads with the highest frame-0 excess
over uniform, the head classes, and the key figures beside the tables.

Every number comes from the tables' run-averaged rows (``prompt_id == '*'``; head
classes from head_diagnostics): the same numbers the figures annotate
(``sinkscope.stats.summaries``), never recomputed here, printed to three significant
digits throughout, ± the standard deviation between runs where there are several.
"Sink" names only heads whose ``head_class`` is sink; borderline labels (``sink?``) are
listed and counted apart.
"""

from __future__ import annotations

import html
import math
import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from sinkscope.io import atomic_path
from sinkscope.naming import head_label, layer_label
from sinkscope.stats.summaries import BORDERLINE, DEFAULT_THRESHOLDS, HEAD_LABELS, is_borderline, resolve_step
from sinkscope.tables import ALL_PROMPTS, RUN_STD_SUFFIX, read_table

DIGITS = 3
TOP = 10
_CURVE_COLUMNS = {
    "logit_mean": {
        "first": "first",
        "middle": "middle",
        "last": "last",
        "own": "own",
        "sink_score": "first − middle",
        "argmax_frame": "argmax frame",
        "diagonal_mean": "diagonal mean",
        "first_column_mean": "frame-0 column mean",
    },
    "prob_mass": {
        "frame0_mass": "mass on frame 0",
        "frame0_uniform": "uniform share of frame 0",
        "frame0_excess": "frame-0 excess",
        "first_k_mass": "mass on the first frames",
        "cache_share": "cache share",
        "own_share": "own-block share",
        "first_middle_ratio": "first / middle",
        "sink_score": "first − middle",
        "argmax_frame": "argmax frame",
    },
}
_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:90em}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}"
    ".note{background:#fff8e1;border-left:4px solid #f0b400;padding:.5em 1em}"
    ".model{background:#eef5fb;border-left:4px solid #2e86ab;padding:.5em 1em}"
    # Tables keep their full width (scrolling inside their box on a narrow page); a figure
    # sits beside them only where it has 28em, else below: nothing is drawn over a table.
    ".pair{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start}"
    ".pair>.tables{flex:0 1 auto;max-width:100%;overflow-x:auto}"
    ".pair>.figures{flex:1 1 28em;min-width:min(28em,100%);max-width:60em}"
    "figure{margin:0}figure img{max-width:100%;border:1px solid #ddd}figcaption{font-size:90%;color:#555}"
)


def number(value: Any) -> str:
    """Every number of the page: integers as they are, the rest to three significant digits."""
    if value is None or isinstance(value, (bool, str)):
        return "–" if value is None else str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    value = float(value)
    if math.isnan(value):
        return "–"
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) >= 10**DIGITS:
        return f"{value:.0f}"
    value = float(f"{value:.{DIGITS}g}")  # 0.09996 -> 0.1, then printed as 0.100
    decimals = max(0, DIGITS - 1 - int(math.floor(math.log10(abs(value)))))
    return f"{value:.{decimals}f}"


def _cell(row: Mapping[str, Any], column: str, runs: int) -> str:
    """A value, ± its std between runs (``<column>_run_std``) with two or more runs."""
    text = number(row.get(column))
    std = row.get(column + RUN_STD_SUFFIX)
    if runs >= 2 and std is not None and not (isinstance(std, float) and math.isnan(std)):
        text += f" ± {number(std)}"
    return text


def _table(rows: list[dict[str, str]], index: str | None = None) -> str:
    """An HTML table of already formatted cells."""
    if not rows:
        return ""
    columns = list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r[c]))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _at_step(stats: pd.DataFrame, step: str | int, metric: str | None = None) -> pd.DataFrame:
    rows = stats[stats["prompt_id"] == ALL_PROMPTS] if "prompt_id" in stats else stats
    if metric is not None:
        rows = rows[rows["metric"] == metric]
    if rows.empty:
        return rows
    pass_, index = resolve_step(rows, step)
    return rows[(rows["pass"] == pass_) & (rows["step"] == index)]


def model_text(name: str, entry: Mapping[str, Any] | None, legacy: Mapping[str, Any] | None = None) -> str:
    """What a source's model is, in words, for the top of the page."""
    if legacy is not None:
        return (
            f"<b>{html.escape(name)}</b>: an imported attention cache, "
            f"<code>{html.escape(str(legacy.get('path')))}</code>"
        )
    entry = entry or {}
    weights = str(entry.get("weights") or "")
    if entry.get("format") == "demo":
        return (
            f"<b>{html.escape(name)}</b>: the <b>untrained</b> demo model (seeded random weights, "
            "<code>format: demo</code>): close to uniform attention by construction"
        )
    if weights.startswith("sinkscope:"):
        return (
            f"<b>{html.escape(name)}</b>: the <b>shipped demo model (trained here, not Self-Forcing)</b>, "
            f"<code>{html.escape(weights)}</code>: the Wan2.1 architecture at demo size trained on the project's "
            "synthetic videos (docs/trained-demo.md); its attention patterns are its own"
        )
    model = f", model <code>{html.escape(str(entry['model']))}</code>" if entry.get("model") else ""
    return (
        f"<b>{html.escape(name)}</b>: your checkpoint <code>{html.escape(weights or '?')}</code> "
        f"(format <code>{html.escape(str(entry.get('format') or 'auto'))}</code>{model})"
    )


def _uniform_note(mass: pd.DataFrame) -> str:
    if mass.empty or not mass["frame0_mass"].notna().any():
        return ""
    frames = int(mass["num_key_frames"].max())
    return (
        f"<p class='note'>Measured here: {number(mass['frame0_mass'].min())}–{number(mass['frame0_mass'].max())} "
        "of the last block's softmax mass on frame 0 across layers; uniform attention over its key tokens would "
        f"give frame 0 {number(mass['frame0_uniform'].mean())} (1 / {frames} key frames).</p>"
    )


def _figure(figures: Mapping[str, str], kind: str, what: str) -> str:
    link = figures.get(kind)
    if not link:
        return ""
    return (
        f"<figure><a href='{html.escape(link)}'><img src='{html.escape(link)}' alt='{html.escape(kind)}' "
        f"loading='lazy'></a><figcaption>{html.escape(what)} ({html.escape(kind)})</figcaption></figure>"
    )


def _effects_figures(shown: Mapping[str, str]) -> str:
    """The paired effects of a checkpoint's variants against its untouched run."""
    return _figure(
        shown, "variant_drift", "each variant's latent distance to the untouched video, frame by frame"
    ) + _figure(shown, "attention_shift", "each variant's change of frame-0 mass per head, edited heads outlined")


def _atlas_figures(shown: Mapping[str, str]) -> str:
    """A checkpoint's atlases (its sweeps against its untouched run), under a heading."""
    body = (
        _figure(shown, "head_atlas", "how far editing one head moves the video, against its untouched frame-0 mass")
        + _figure(shown, "frame_atlas", "how far editing one cached frame moves the video, against its mass")
        + _figure(shown, "pruning_curve", "the k heads of least drift edited together, against two control orders")
    )
    return "<h3>Atlases</h3>" + body if body else ""


def _pair(left: str, right: str) -> str:
    return (
        f"<div class='pair'><div class='tables'>{left}</div><div class='figures'>{right}</div></div>" if right else left
    )


def summary_html(
    layer_stats: pd.DataFrame,
    head_stats: pd.DataFrame,
    head_diagnostics: pd.DataFrame,
    options: Mapping[str, Any],
    figures: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """A self-contained HTML page of the run-averaged statistics, per source; ``figures``:
    per source (or checkpoint) name, figure kind -> a link relative to the page."""
    figures = figures or {}
    # Per checkpoint, its untouched run first: every variant is read against it.
    sources = sorted(
        set(layer_stats["checkpoint"] + "@" + layer_stats["variant"]),
        key=lambda source: (source.split("@", 1)[0], source.split("@", 1)[1] != "default", source),
    )
    parts = _page_head(sources, options)
    placed = set()
    for source in sources:
        checkpoint, variant = source.split("@", 1)
        name = checkpoint if variant == "default" else source
        shown = (
            {**figures.get(checkpoint, {}), **figures.get(name, {})} if variant == "default" else figures.get(name, {})
        )
        placed |= {checkpoint, name} if variant == "default" else {name}
        tables = {
            "layer_stats": layer_stats[(layer_stats["checkpoint"] == checkpoint) & (layer_stats["variant"] == variant)],
            "head_stats": head_stats[(head_stats["checkpoint"] == checkpoint) & (head_stats["variant"] == variant)],
            "head_diagnostics": head_diagnostics[
                (head_diagnostics["checkpoint"] == checkpoint) & (head_diagnostics["variant"] == variant)
            ],
        }
        parts.append(f"<h2>{html.escape(name)}</h2>")
        parts += _source_section(tables, options, shown)
    # A checkpoint's figures over its variants, when no source is named like it.
    for name in sorted(set(figures) - placed):
        body = _every_variant_figures(figures[name])
        if body:
            parts.append(f"<h2>{html.escape(name)}: every variant</h2>" + body)
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)


def _sink_threshold(options: Mapping[str, Any]) -> str:
    sink_ratio = {**DEFAULT_THRESHOLDS, **(options.get("diagnostics") or {})}["sink_ratio"]
    return f"frame-0 mass ≥ {number(sink_ratio)}× its uniform share"


def _page_head(sources: list[str], options: Mapping[str, Any]) -> list[str]:
    """The page up to the first source: which models, and how to read the numbers."""
    checkpoints = options.get("checkpoints", {})
    legacy = options.get("legacy_caches", {})
    names = sorted({s.split("@", 1)[0] for s in sources})
    models = "".join(f"<li>{model_text(n, checkpoints.get(n), legacy.get(n))}</li>" for n in names)
    return [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>sinkscope summary</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>Attention-sink summary</h1>",
        f"<div class='model'><p><b>Model{'s' if len(names) != 1 else ''}</b>:</p><ul>{models}</ul></div>",
        f"<p>The last block's queries, averaged over its frames and over every prompt and seed, against the key frames "
        f"they see (the Figure 4 view), call <b>{html.escape(str(options['step']))}</b>. These are the rows with "
        "<code>prompt_id = '*'</code> of <code>layer_stats.parquet</code> / <code>head_stats.parquet</code>: the "
        "statistics of the run-averaged curve, the numbers the figures show; with several runs, ± the standard "
        "deviation between runs (<code>*_run_std</code>). <i>first</i> / <i>last</i> are the oldest / newest cache "
        "frame before the block, <i>middle</i> the mean of those between, <i>own</i> the block's own frames. "
        "<b>Frame-0 excess</b> = the softmax mass on frame 0 − the mass uniform attention over the key tokens seen "
        "would give it (1 / visible key frames without dropped tokens): 0 = no preference for frame 0. A head is "
        f"called a <b>sink</b> only when head_diagnostics classes it so ({_sink_threshold(options)}), <b>sink?</b> "
        "(borderline) when its runs straddle that (mean ± std between runs); <i>first − middle</i> "
        "(the <code>sink_score</code> column) is a difference, not a verdict. Ratios and shares exist for softmax "
        f"mass only. Numbers to {DIGITS} significant digits. Layers and heads in paper notation (L1 = layer index "
        "0).</p>",
    ]


def _source_section(
    tables: Mapping[str, pd.DataFrame], options: Mapping[str, Any], shown: Mapping[str, str]
) -> list[str]:
    """One source's part of the page: its layer tables, sink-class and top heads, head
    classes, and the figures beside them."""
    step, metric = options["step"], options["metric"]
    chosen = {m: _at_step(tables["layer_stats"], step, m) for m in _CURVE_COLUMNS}
    if chosen[metric].empty:
        return ["<p>No rows for this call.</p>"]
    runs = int(chosen[metric]["runs"].max())
    diagnostics = tables["head_diagnostics"]
    calls = _at_step(diagnostics, step) if not diagnostics.empty else diagnostics
    parts = [
        _uniform_note(chosen["prob_mass"]),
        _pair(
            _layer_tables(chosen, runs),
            _figure(shown, "first_middle_last", "first, middle, last and own frames of the softmax mass table"),
        ),
        _pair(
            _head_tables(calls, tables["head_stats"], options, runs),
            _figure(shown, "figure4", "the chosen heads' attention")
            + _figure(
                shown,
                "sink_score_overview",
                "first − middle of every head's softmax mass (the prob_mass column above), sink-class outlined",
            ),
        ),
    ]
    if len(calls):
        parts.append(_pair(_head_classes_text(calls), _figure(shown, "head_classes", "head classes")))
    over_time = _figure(
        shown,
        "sink_mass_over_time",
        "mass on frame 0 / the sink frames block by block, and its excess over uniform",
    )
    if over_time:
        parts.append("<h3>Block by block</h3>" + over_time)
    edits = _figure(shown, "policy_comparison", "the chosen heads under every variant") + _effects_figures(shown)
    if edits:
        parts.append("<h3>Variants against the untouched video</h3>" + edits)
    atlases = _atlas_figures(shown)
    if atlases:
        parts.append(atlases)
    cache = _figure(
        shown, "cache_timeline", "the key frames the KV cache holds block by block, at their RoPE positions"
    )
    if cache:
        parts.append("<h3>The KV cache</h3>" + cache)
    return parts


def _layer_tables(chosen: Mapping[str, pd.DataFrame], runs: int) -> str:
    """The head-averaged curve's statistics per layer, in logits and in softmax mass."""
    runs_text = f"mean curve of {runs} run{'s' * (runs != 1)}" + (", ± std between runs" if runs >= 2 else "")
    tables = []
    for label, key in (("Pre-softmax logits (mean q·k/√d)", "logit_mean"), ("Softmax mass", "prob_mass")):
        records = [
            {
                "layer": layer_label(int(r["layer"])),
                **{title: _cell(r, column, runs) for column, title in _CURVE_COLUMNS[key].items()},
            }
            for r in chosen[key].sort_values("layer").to_dict("records")
        ]
        tables.append(f"<h3>{label}, head-averaged, per layer ({runs_text})</h3>" + _table(records))
    return "".join(tables)


def _head_tables(calls: pd.DataFrame, head_stats: pd.DataFrame, options: Mapping[str, Any], runs: int) -> str:
    """The sink-class heads (or that there are none, and the borderline ones apart), then the
    heads with the highest frame-0 excess over uniform."""
    step, metric = options["step"], options["metric"]
    threshold = _sink_threshold(options)
    classes = {(int(r.layer), int(r.head)): str(r.head_class) for r in calls.itertuples()}
    ranked = calls.sort_values("frame0_ratio" if "frame0_ratio" in calls else "frame0_mass", ascending=False)
    sinks = ranked[ranked["head_class"] == "sink"] if len(calls) else calls
    maybe = ranked[ranked["head_class"] == "sink" + BORDERLINE] if len(calls) else calls
    section = ["<h3>Sink-class heads</h3>"]
    borderline_text = (
        f" {len(maybe)} more {'are' if len(maybe) != 1 else 'is'} borderline (sink?: the runs "
        "straddle the threshold), listed apart."
        if len(maybe)
        else ""
    )
    if len(calls) and sinks.empty:
        section.append(
            f"<p>None: no head is classed sink at this call ({threshold}; {len(calls)} heads)."
            f"{borderline_text} The heads below draw the most on frame 0 relative to uniform.</p>"
        )
    if len(calls) and len(sinks) + len(maybe):
        records = [
            {
                "head": head_label(int(r["layer"]), int(r["head"])),
                "class": r["head_class"],
                "frame-0 mass ÷ uniform": _cell(r, "frame0_ratio", runs),
                "mass on frame 0": _cell(r, "frame0_mass", runs),
                "uniform share": number(r.get("frame0_uniform")),
                "frame-0 excess": _cell(r, "frame0_excess", runs),
                "recent mass": _cell(r, "recent_mass", runs),
                "entropy over frames": _cell(r, "entropy_frames", runs),
            }
            for r in pd.concat([sinks, maybe]).to_dict("records")
        ]
        if len(sinks):
            section.append(f"<p>{len(sinks)} of {len(calls)} heads ({threshold}).{borderline_text}</p>")
        section.append(_table(records))
    elif not len(calls):
        section.append("<p>No head_diagnostics rows for this call.</p>")
    mass = _at_step(head_stats, step, "prob_mass")
    if not mass.empty:
        shown_metric = _at_step(head_stats, step, metric).set_index(["layer", "head"])
        top = mass.sort_values("frame0_excess", ascending=False, na_position="last").head(TOP)
        records = []
        for r in top.to_dict("records"):
            key = (int(r["layer"]), int(r["head"]))
            other = shown_metric.loc[key].to_dict() if key in shown_metric.index else {}
            records.append(
                {
                    "head": head_label(*key),
                    "class": classes.get(key, "–"),
                    "frame-0 excess": _cell(r, "frame0_excess", runs),
                    "mass on frame 0": _cell(r, "frame0_mass", runs),
                    "uniform share": number(r.get("frame0_uniform")),
                    # sink_score_overview's number (it draws softmax mass), and the chosen metric's
                    "first − middle (prob_mass)": _cell(r, "sink_score", runs),
                    **(
                        {f"first − middle ({metric})": _cell(other, "sink_score", runs)}
                        if metric != "prob_mass"
                        else {}
                    ),
                }
            )
        section.append(
            f"<h3>Highest frame-0 excess over uniform (softmax mass, top {len(records)})</h3>" + _table(records)
        )
    return "".join(section)


def _head_classes_text(calls: pd.DataFrame) -> str:
    """How many heads of each class, and on how many runs the classes were decided."""
    counts = calls["head_class"].value_counts()
    shown_labels = [k for k in HEAD_LABELS if not is_borderline(k) or counts.get(k, 0)]
    shown_labels += sorted(set(counts.index) - set(HEAD_LABELS))
    class_runs = int(calls["runs"].max())
    decided = (
        f"on {class_runs} runs: a label with ? is borderline, its statistic's mean ± std between runs holds "
        "the threshold"
        if class_runs >= 2
        else "on one run: no interval, so no borderline label"
    )
    return (
        "<h3>Head classes</h3><p>"
        + ", ".join(f"{k}{' (borderline)' if is_borderline(k) else ''}: {int(counts.get(k, 0))}" for k in shown_labels)
        + f"; decided {decided} (thresholds: config <code>diagnostics:</code>, docs/statistics.md)</p>"
    )


def _every_variant_figures(shown: Mapping[str, str]) -> str:
    return (
        _figure(
            shown,
            "sink_mass_over_time",
            "mass on frame 0 / the sink frames block by block, and its excess over uniform, every variant",
        )
        + _figure(shown, "policy_comparison", "the chosen heads under every variant")
        + _effects_figures(shown)
        + _atlas_figures(shown)
    )


def summary_job(
    layer_stats_path: str | Path,
    head_stats_path: str | Path,
    head_diagnostics_path: str | Path,
    output: str | Path,
    options: Mapping[str, Any],
) -> None:
    """The pipeline's job: the summary page from the combined tables, with the figures of
    ``options['figures']`` (paths relative to the working directory) linked relative to
    the page."""
    page = Path(output).parent
    figures = {
        name: {kind: Path(os.path.relpath(figure, page)).as_posix() for kind, figure in kinds.items()}
        for name, kinds in (options.get("figures") or {}).items()
    }
    html_text = summary_html(
        read_table(layer_stats_path), read_table(head_stats_path), read_table(head_diagnostics_path), options, figures
    )
    with atomic_path(output) as tmp:
        tmp.write_text(html_text)
