"""Deep Forcing Figure 4 at frame resolution: for each head in ``heads``, the last block's
query-averaged attention to every key frame (bars), the block's own frames shaded, frames
not in the KV cache grey (the line breaks there), the sink score and the argmax frame
(``summaries.curve_stats``) in the panel."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from sinkscope.figures import common as c


def panel(ax, view: c.View, layer: int, head: int, *, color: str, base: int, length: float) -> bool:
    """One head's Figure 4 panel; whether its curve has gaps."""
    label = c.head_label(layer, head)
    if not view.has(layer, head):
        c.message_panel(ax, f"{label}: layer {layer} / head {head} was not extracted\n(add the layer to config 'layers')")
        ax.set_title(c.head_text(layer, head), fontweight="bold")
        return False
    curve = view.curve(layer, head)
    gaps = c.curve_panel(ax, curve, view.query_frames, color=color, base=base, gid=label, length=length)
    stats = view.stats(layer, head)
    if stats["argmax_frame"] >= 0:
        c.annotate_max(ax, stats["argmax_frame"], float(curve.loc[stats["argmax_frame"]]), base)
    c.headroom(ax)
    score = c.number(stats["sink_score"], view.metric, signed=True)
    ax.set_title(f"{c.head_text(layer, head)} · sink score {score}", fontweight="bold")
    ax.set_xlabel("key frame")
    ax.set_ylabel(c.metric_axis_label(view.metric))
    return gaps


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    frame = c.one_source(c.table(tables, "frame_attention", "figure4"), "figure4")
    metric, base = c.option(options, "metric"), int(c.option(options, "frame_base"))
    heads = c.heads_of(options)
    view = c.figure4_view(c.layers_of(frame, heads), c.option(options, "step"), metric)
    if ax is not None:
        if len(heads) != 1:
            raise ValueError("figure4 draws into one axes only for one head (heads=['L1H1'])")
        label, layer, head = heads[0]
        panel(ax, view, layer, head, color=c.PANEL_COLORS[0], base=base, length=ax.figure.get_size_inches()[0])
        return ax.figure
    ncols = 1 if len(heads) == 1 else 2 if len(heads) <= 4 else 3 if len(heads) <= 9 else 4
    width = {1: 7.5, 2: 6.0, 3: 4.8, 4: 4.2}[ncols]
    fig, axes = c.panel_grid(len(heads), ncols=ncols, panel=(width, 3.4 if ncols < 3 else 3.0))
    gaps = False
    for index, (ax_, (_, layer, head)) in enumerate(zip(axes, heads)):
        color = c.PANEL_COLORS[index % len(c.PANEL_COLORS)]
        gaps |= panel(ax_, view, layer, head, color=color, base=base, length=width - 0.8)
    legend = [c.own_handle(view.query_frames, base)] + ([c.gap_handle()] if gaps else [])
    visible = c.frames_text(view.visible, base)
    return c.finish(
        fig,
        title=f"Frame-wise attention of the last block: query frames {c.frames_text(view.query_frames, base)} "
        f"→ key frames {visible}",
        subtitle=c.subtitle(source, view.call, c.METRIC_SHORT[metric], view.runs),
        legend=legend,
        caption=(
            f"Bars: {c.METRIC_LABELS[metric]} of each key frame, queries averaged over the last block. "
            "Sink score = first cache frame − mean of the cache frames between the first and the last; "
            "max@ = the key frame with the largest value (sinkscope.stats.summaries.curve_stats)."
        ),
    )

