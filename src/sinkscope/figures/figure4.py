"""Deep Forcing Figure 4 at frame resolution: for each head in ``heads``, the last block's
query-averaged attention to every key frame (bars, ±1 std between runs), the block's own
frames shaded, frames not in the KV cache grey (the line breaks there), the uniform
baseline on softmax mass, and in each title the head's class, its frame-0 excess over
uniform and first − middle (``summaries.curve_stats``; "sink" only for sink-class heads)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from sinkscope.figures.colours import PANEL_COLORS
from sinkscope.figures.layout import finish, message_panel, panel_grid
from sinkscope.figures.marks import (
    annotate_max,
    curve_panel,
    gap_handle,
    headroom,
    own_handle,
    spread_handle,
    uniform_handle,
)
from sinkscope.figures.style import heads_of, option
from sinkscope.figures.text import (
    METRIC_LABELS,
    METRIC_SHORT,
    class_text,
    frames_text,
    head_text,
    metric_axis_label,
    subtitle,
)
from sinkscope.figures.views import (
    View,
    difference_text,
    excess_text,
    figure4_view,
    head_classes,
    layers_of,
    mass_view,
    one_source,
    table,
)
from sinkscope.naming import head_label


def title(view: View, mass: View, layer: int, head: int, klass: str | None) -> str:
    """'L5H10 (layer 4, head 9) · periodic head' over 'frame-0 excess +0.012 ± 0.003 ·
    first − middle +0.29'."""
    return (
        f"{head_text(layer, head)} · {class_text(klass)}\n"
        f"{excess_text(mass, layer, head, spread=True)} · {difference_text(view, layer, head)}"
    )


def panel(
    ax, view: View, mass: View, layer: int, head: int, klass: str | None, *, color: str, base: int, length: float
) -> bool:
    """One head's Figure 4 panel; whether its curve has gaps."""
    label = head_label(layer, head)
    if not view.has(layer, head):
        message_panel(ax, f"{label}: layer {layer} / head {head} was not extracted\n(add the layer to config 'layers')")
        ax.set_title(head_text(layer, head), fontweight="bold")
        return False
    curve = view.curve(layer, head)
    uniform = view.baseline(layer, head) if view.metric == "prob_mass" else None
    gaps = curve_panel(
        ax,
        curve,
        view.query_frames,
        color=color,
        base=base,
        gid=label,
        length=length,
        std=view.std(layer, head),
        uniform=uniform,
    )
    stats = view.stats(layer, head)
    if stats["argmax_frame"] >= 0:
        annotate_max(ax, stats["argmax_frame"], float(curve.loc[stats["argmax_frame"]]), base)
    headroom(ax)
    ax.set_title(title(view, mass, layer, head, klass), fontweight="bold", fontsize=10)
    ax.set_xlabel("key frame")
    ax.set_ylabel(metric_axis_label(view.metric))
    return gaps


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    frame = one_source(table(tables, "frame_attention", "figure4"), "figure4")
    metric, base = option(options, "metric"), int(option(options, "frame_base"))
    heads = heads_of(options)
    rows = layers_of(frame, heads)
    view = figure4_view(rows, option(options, "step"), metric)
    mass = mass_view(rows, view)
    classes, classes_from = head_classes(tables.get("head_diagnostics"), rows, view)
    if ax is not None:
        if len(heads) != 1:
            raise ValueError("figure4 draws into one axes only for one head (heads=['L1H1'])")
        label, layer, head = heads[0]
        panel(
            ax,
            view,
            mass,
            layer,
            head,
            classes.get((layer, head)),
            color=PANEL_COLORS[0],
            base=base,
            length=ax.figure.get_size_inches()[0],
        )
        return ax.figure
    ncols = 1 if len(heads) == 1 else 2 if len(heads) <= 4 else 3 if len(heads) <= 9 else 4
    width = {1: 7.5, 2: 6.0, 3: 4.8, 4: 4.2}[ncols]
    fig, axes = panel_grid(len(heads), ncols=ncols, panel=(width, 3.6 if ncols < 3 else 3.2))
    gaps = False
    for index, (ax_, (_, layer, head)) in enumerate(zip(axes, heads)):
        color = PANEL_COLORS[index % len(PANEL_COLORS)]
        gaps |= panel(
            ax_, view, mass, layer, head, classes.get((layer, head)), color=color, base=base, length=width - 0.8
        )
    legend = [own_handle(view.query_frames, base)] + ([gap_handle()] if gaps else [])
    legend += [uniform_handle()] if metric == "prob_mass" else []
    legend += [spread_handle()] if view.runs >= 2 else []
    visible = frames_text(view.visible, base)
    return finish(
        fig,
        title=f"Frame-wise attention of the last block: query frames {frames_text(view.query_frames, base)} "
        f"→ key frames {visible}",
        subtitle=subtitle(source, view.call, METRIC_SHORT[metric], view.runs, "error bars ±1 std between runs"),
        legend=legend,
        caption=(
            f"Bars: {METRIC_LABELS[metric]} of each key frame, queries averaged over the last block. "
            "Titles: the head's class (sink, local, periodic, diffuse; "
            f"{classes_from}); frame-0 excess = softmax mass on frame 0 − the mass uniform attention over the key "
            "tokens would give it (1 / visible frames), ± the std between runs; first − middle = first cache frame − "
            "mean of the cache frames between the first and the last (head_stats sink_score); max@ = the key frame "
            "with the largest value (sinkscope.stats.summaries.curve_stats)."
        ),
    )
