"""The KV-cache policies of one checkpoint side by side: the Figure 4 panels of the last
block, one row per variant, one column per head of ``heads``; each column (one head)
shares its y scale, gaps where a policy evicted frames."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from sinkscope.figures import common as c


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "policy_comparison"
    if ax is not None:
        raise ValueError(f"{kind} is a grid of panels; it draws its own figure (leave ax out)")
    frame = c.table(tables, "frame_attention", kind)
    checkpoints = sorted(str(x) for x in pd.unique(frame["checkpoint"]))
    if len(checkpoints) > 1:
        raise ValueError(f"figure {kind} draws one checkpoint; the table holds {', '.join(checkpoints)} (checkpoint=...)")
    metric, base = c.option(options, "metric"), int(c.option(options, "frame_base"))
    variants = c.variants_in(frame)
    frame = c.layers_of(frame, c.heads_of(options))
    views = {v: c.figure4_view(frame[frame["variant"] == v], c.option(options, "step"), metric) for v in variants}
    heads = c.heads_of(options)
    ncols = len(heads)
    panel = (5.2, 2.5) if ncols <= 2 else (3.6, 2.3)
    fig = c.new_figure(ncols * panel[0], len(variants) * panel[1])
    axes = fig.subplots(len(variants), ncols, squeeze=False)
    gaps = False
    for j, (label, layer, head) in enumerate(heads):
        color = c.PANEL_COLORS[j % len(c.PANEL_COLORS)]
        column = []
        for i, variant in enumerate(variants):
            ax_, view = axes[i, j], views[variant]
            if not view.has(layer, head):
                c.message_panel(ax_, f"{label}: layer {layer} was not extracted")
                continue
            gaps |= c.curve_panel(ax_, view.curve(layer, head), view.query_frames, color=color, base=base,
                                  gid=f"{label}-{variant}", length=panel[0] - 0.7, markersize=2.0)  # fmt: skip
            stats = view.stats(layer, head)
            ax_.set_title(f"{variant} · {label} · sink {c.number(stats['sink_score'], metric, signed=True)} · "
                          f"max@{stats['argmax_frame'] + base}", fontsize=9)  # fmt: skip
            column.append(ax_)
        if column:
            lo, hi = min(a.get_ylim()[0] for a in column), max(a.get_ylim()[1] for a in column)
            for a in column:
                a.set_ylim(lo, hi)
    c.outer_labels(axes.ravel(), "key frame", c.METRIC_SHORT[metric].split(" (")[0])
    first = views[variants[0]]
    own = sorted({f for v in views.values() for f in v.query_frames})
    legend = [c.own_handle(own, base)] + ([c.gap_handle()] if gaps else [])
    runs = sorted({v.runs for v in views.values()})
    return c.finish(
        fig,
        title=f"KV-cache policies of {source}: the last block's attention, one row per variant",
        subtitle=c.subtitle(source, first.call, c.METRIC_SHORT[metric], runs[0]) if len(runs) == 1 else
        " · ".join([source, first.call, c.METRIC_SHORT[metric], f"means of {', '.join(map(str, runs))} runs"]),
        legend=legend,
        caption=("Each head's panels share one y scale. sink = first cache frame − mean of the cache frames between; "
                 "max@ = the largest key frame (sinkscope.stats.summaries.curve_stats)."),
    )  # fmt: skip
