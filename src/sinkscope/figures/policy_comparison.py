"""The variants of one checkpoint side by side (KV-cache policies, edits, lengths: whatever
its variants change): the Figure 4 panels of the last block, one row per variant, one
column per head of ``heads``; each column (one head) shares its y scale, gaps where a
variant's cache evicted frames, ±1 std between runs, the uniform baseline on softmax mass,
and each head's class and frame-0 excess under each variant."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from sinkscope.figures.colours import PANEL_COLORS
from sinkscope.figures.layout import finish, message_panel, new_figure, outer_labels
from sinkscope.figures.marks import (
    curve_panel,
    gap_handle,
    own_handle,
    spread_handle,
    uniform_handle,
)
from sinkscope.figures.style import heads_of, option
from sinkscope.figures.text import METRIC_LABELS, METRIC_SHORT, class_text, subtitle
from sinkscope.figures.views import (
    excess_text,
    figure4_view,
    head_classes,
    layers_of,
    mass_view,
    one_checkpoint,
    table,
    variants_in,
)


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "policy_comparison"
    if ax is not None:
        raise ValueError(f"{kind} is a grid of panels; it draws its own figure (leave ax out)")
    frame = table(tables, "frame_attention", kind)
    one_checkpoint(frame, kind)
    metric, base = option(options, "metric"), int(option(options, "frame_base"))
    variants = variants_in(frame)
    frame = layers_of(frame, heads_of(options))
    diagnostics = tables.get("head_diagnostics")
    views, masses, classes = {}, {}, {}
    for v in variants:
        rows = frame[frame["variant"] == v]
        views[v] = figure4_view(rows, option(options, "step"), metric)
        masses[v] = mass_view(rows, views[v])
        chosen = (
            diagnostics[diagnostics["variant"] == v] if diagnostics is not None and "variant" in diagnostics else None
        )
        classes[v] = head_classes(chosen, rows, views[v])
    heads = heads_of(options)
    ncols = len(heads)
    panel = (5.2, 2.6) if ncols <= 2 else (3.6, 2.4)
    fig = new_figure(ncols * panel[0], len(variants) * panel[1])
    axes = fig.subplots(len(variants), ncols, squeeze=False)
    gaps = False
    for j, (label, layer, head) in enumerate(heads):
        color = PANEL_COLORS[j % len(PANEL_COLORS)]
        column = []
        for i, variant in enumerate(variants):
            ax_, view = axes[i, j], views[variant]
            if not view.has(layer, head):
                message_panel(ax_, f"{label}: layer {layer} was not extracted")
                continue
            uniform = view.baseline(layer, head) if metric == "prob_mass" else None
            gaps |= curve_panel(
                ax_,
                view.curve(layer, head),
                view.query_frames,
                color=color,
                base=base,
                gid=f"{label}-{variant}",
                length=panel[0] - 0.7,
                markersize=2.0,
                std=view.std(layer, head),
                uniform=uniform,
            )
            klass = classes[variant][0].get((layer, head))
            # The variant quoted: a policy named "sink" is no claim about the head.
            ax_.set_title(
                f"variant '{variant}' · {label} · {class_text(klass)}\n"
                f"{excess_text(masses[variant], layer, head)} · "
                f"max@{view.stats(layer, head)['argmax_frame'] + base}",
                fontsize=9,
            )
            column.append(ax_)
        if column:
            lo, hi = min(a.get_ylim()[0] for a in column), max(a.get_ylim()[1] for a in column)
            for a in column:
                a.set_ylim(lo, hi)
    outer_labels(axes.ravel(), "key frame", METRIC_SHORT[metric].split(" (")[0])
    first = views[variants[0]]
    own = sorted({f for v in views.values() for f in v.query_frames})
    legend = [own_handle(own, base)] + ([gap_handle()] if gaps else [])
    legend += [uniform_handle()] if metric == "prob_mass" else []
    runs = sorted({v.runs for v in views.values()})
    legend += [spread_handle()] if runs[-1] >= 2 else []
    spread = "error bars ±1 std between runs"
    return finish(
        fig,
        title=f"The variants of {source} side by side: the last block's attention, one row per variant",
        subtitle=subtitle(source, first.call, METRIC_SHORT[metric], runs[0], spread)
        if len(runs) == 1
        else " · ".join(
            [source, first.call, METRIC_SHORT[metric], f"means of n = {', '.join(map(str, runs))} runs, {spread}"]
        ),
        legend=legend,
        caption=(
            f"Bars: {METRIC_LABELS[metric]} of each key frame, queries averaged over the last block. "
            "Each head's panels share one y scale. Titles: the head's class under that variant "
            f"({classes[variants[0]][1]}); frame-0 excess = softmax mass on frame 0 − its uniform share "
            "(1 / visible frames, key tokens counted); max@ = the largest key frame "
            "(sinkscope.stats.summaries.curve_stats)."
        ),
    )
