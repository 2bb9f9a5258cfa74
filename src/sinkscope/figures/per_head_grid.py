"""One layer, every head: the last block's Figure 4 bars of each head, on one shared y
scale for softmax mass (the heads compare) and on each head's own for logits (a head's
logit level does not change its attention: ``layout.panel_y_scales``), ±1 std between
runs, its own frames shaded, gaps where frames are not in the KV cache, the uniform
baseline on softmax mass, and each head's class and frame-0 excess over uniform
(``summaries.curve_stats``) in its title."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from sinkscope.figures.colours import PANEL_COLORS
from sinkscope.figures.layout import (
    LOGIT_LEVEL_NOTE,
    finish,
    outer_labels,
    panel_columns,
    panel_grid,
    panel_y_scales,
)
from sinkscope.figures.marks import (
    curve_panel,
    gap_handle,
    own_handle,
    spread_handle,
    uniform_handle,
)
from sinkscope.figures.style import option
from sinkscope.figures.text import METRIC_LABELS, METRIC_SHORT, frames_text, subtitle
from sinkscope.figures.views import (
    excess_text,
    figure4_view,
    head_classes,
    mass_view,
    one_source,
    table,
)
from sinkscope.naming import head_label, layer_label


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, layer: int, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "per_head_grid"
    if ax is not None:
        raise ValueError(f"{kind} is a grid of panels; it draws its own figure (leave ax out)")
    frame = one_source(table(tables, "frame_attention", kind), kind)
    metric, base = option(options, "metric"), int(option(options, "frame_base"))
    rows = frame[frame["layer"] == layer]
    view = figure4_view(rows, option(options, "step"), metric)
    mass = mass_view(rows, view)
    classes, classes_from = head_classes(tables.get("head_diagnostics"), rows, view)
    heads = view.heads(layer)
    ncols = panel_columns(len(heads))
    panel = (3.5, 2.5) if ncols <= 4 else (2.8, 2.2) if ncols <= 6 else (2.3, 2.0)
    fig, axes = panel_grid(len(heads), ncols=ncols, panel=panel)
    color = PANEL_COLORS[0]
    gaps = False
    for ax_, head in zip(axes, heads):
        label = head_label(layer, head)
        uniform = view.baseline(layer, head) if metric == "prob_mass" else None
        gaps |= curve_panel(
            ax_,
            view.curve(layer, head),
            view.query_frames,
            color=color,
            base=base,
            gid=label,
            length=panel[0] - 0.6,
            markersize=1.8,
            std=view.std(layer, head),
            uniform=uniform,
        )
        klass = classes.get((layer, head))
        ax_.set_title(
            f"H{head + 1} · {klass or 'class n/a'}\n{excess_text(mass, layer, head, short=True)}",
            fontsize=9,
            fontweight="bold" if klass == "sink" else "normal",
        )
    shared = panel_y_scales(axes, metric)
    outer_labels(axes, "key frame", METRIC_SHORT[metric].split(" (")[0])
    legend = [own_handle(view.query_frames, base)] + ([gap_handle()] if gaps else [])
    legend += [uniform_handle()] if metric == "prob_mass" else []
    legend += [spread_handle()] if view.runs >= 2 else []
    return finish(
        fig,
        title=f"Layer {layer_label(layer)} (index {layer}): every head's attention, query frames "
        f"{frames_text(view.query_frames, base)}",
        subtitle=subtitle(source, view.call, METRIC_SHORT[metric], view.runs, "error bars ±1 std between runs"),
        legend=legend,
        caption=(
            f"Bars: each head's {METRIC_LABELS[metric]} of a key frame, queries averaged over the last block. "
            + ("One y scale for every head." if shared else f"Each head on its own y scale. {LOGIT_LEVEL_NOTE}")
            + f" Titles: the head's class ({classes_from}; bold: sink) and its "
            "frame-0 excess = softmax mass on frame 0 − its uniform share (1 / visible frames) "
            "(sinkscope.stats.summaries.curve_stats, the head_stats rows with prompt_id '*')."
        ),
    )
