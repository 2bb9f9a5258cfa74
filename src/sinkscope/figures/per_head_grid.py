"""One layer, every head: the last block's Figure 4 bars of each head on one shared y
scale (the heads compare), ±1 std between runs, its own frames shaded, gaps where frames
are not in the KV cache, the uniform baseline on softmax mass, and each head's class and
frame-0 excess over uniform (``summaries.curve_stats``) in its title."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from sinkscope.figures import common as c


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, layer: int, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "per_head_grid"
    if ax is not None:
        raise ValueError(f"{kind} is a grid of panels; it draws its own figure (leave ax out)")
    frame = c.one_source(c.table(tables, "frame_attention", kind), kind)
    metric, base = c.option(options, "metric"), int(c.option(options, "frame_base"))
    rows = frame[frame["layer"] == layer]
    view = c.figure4_view(rows, c.option(options, "step"), metric)
    mass = c.mass_view(rows, view)
    classes, classes_from = c.head_classes(tables.get("head_diagnostics"), rows, view)
    heads = view.heads(layer)
    ncols = c.panel_columns(len(heads))
    panel = (3.5, 2.5) if ncols <= 4 else (2.8, 2.2) if ncols <= 6 else (2.3, 2.0)
    fig, axes = c.panel_grid(len(heads), ncols=ncols, panel=panel)
    color = c.PANEL_COLORS[0]
    gaps = False
    for ax_, head in zip(axes, heads):
        label = c.head_label(layer, head)
        uniform = view.baseline(layer, head) if metric == "prob_mass" else None
        gaps |= c.curve_panel(ax_, view.curve(layer, head), view.query_frames, color=color, base=base, gid=label,
                              length=panel[0] - 0.6, markersize=1.8, std=view.std(layer, head),
                              uniform=uniform)  # fmt: skip
        klass = classes.get((layer, head))
        ax_.set_title(f"H{head + 1} · {klass or 'class n/a'}\n{c.excess_text(mass, layer, head, short=True)}",
                      fontsize=9, fontweight="bold" if klass == "sink" else "normal")  # fmt: skip
    c.share_y(axes)
    c.outer_ticks(axes)
    c.outer_labels(axes, "key frame", c.METRIC_SHORT[metric].split(" (")[0])
    legend = [c.own_handle(view.query_frames, base)] + ([c.gap_handle()] if gaps else [])
    legend += [c.uniform_handle()] if metric == "prob_mass" else []
    legend += [c.spread_handle()] if view.runs >= 2 else []
    return c.finish(
        fig,
        title=f"Layer {c.layer_label(layer)} (index {layer}): every head's attention, query frames "
        f"{c.frames_text(view.query_frames, base)}",
        subtitle=c.subtitle(source, view.call, c.METRIC_SHORT[metric], view.runs, "error bars ±1 std between runs"),
        legend=legend,
        caption=(f"One y scale for every head. Titles: the head's class ({classes_from}; bold: sink) and its "
                 "frame-0 excess = softmax mass on frame 0 − its uniform share (1 / visible frames) "
                 "(sinkscope.stats.summaries.curve_stats, the head_stats rows with prompt_id '*')."),
    )  # fmt: skip
