"""Figure 4 at every call of the last block on one page (Deep Forcing Fig. 11): rows = the
denoising steps and the cache pass, columns = the heads of ``heads``; each column (one
head) shares its y scale, so the calls compare. With more than four heads the grid turns
(rows = heads, columns = calls), so any number of heads stays a readable grid (Fig. 16)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from sinkscope.figures import common as c


def short_call(view: c.View) -> str:
    if view.pass_ == "cache":
        return f"cache pass (t={view.timestep:g})"
    if view.step < 0:
        return "imported call"
    return f"step {view.step} (t={view.timestep:g})"


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "figure4_steps"
    if ax is not None:
        raise ValueError(f"{kind} is a grid of panels; it draws its own figure (leave ax out)")
    frame = c.one_source(c.table(tables, "frame_attention", kind), kind)
    metric, base = c.option(options, "metric"), int(c.option(options, "frame_base"))
    heads = c.heads_of(options)
    frame = c.layers_of(frame, heads)
    views = [c.figure4_view(frame, call, metric) for call in c.last_block_calls(frame)]
    turned = len(heads) > 4
    nrows, ncols = (len(heads), len(views)) if turned else (len(views), len(heads))
    panel = (3.4, 2.3) if turned or ncols > 2 else (5.6, 2.4)
    fig = c.new_figure(ncols * panel[0], nrows * panel[1])
    axes = fig.subplots(nrows, ncols, squeeze=False)
    gaps = False
    for h, (label, layer, head) in enumerate(heads):
        cells = [axes[h, v] if turned else axes[v, h] for v in range(len(views))]
        color = c.PANEL_COLORS[h % len(c.PANEL_COLORS)]
        for ax_, view in zip(cells, views):
            if not view.has(layer, head):
                c.message_panel(ax_, f"{label}: layer {layer} was not extracted")
                ax_.set_title(f"{label} · {short_call(view)}", fontsize=9, fontweight="bold")
                continue
            gaps |= c.curve_panel(ax_, view.curve(layer, head), view.query_frames, color=color, base=base,
                                  gid=f"{label}-{view.pass_}{view.step}", length=panel[0] - 0.7, markersize=2.0)  # fmt: skip
            stats = view.stats(layer, head)
            ax_.set_title(f"{label} · {short_call(view)}\nsink {c.number(stats['sink_score'], metric, signed=True)}"
                          f" · max@{stats['argmax_frame'] + base}", fontsize=9)  # fmt: skip
        shown = [a for a, v in zip(cells, views) if v.has(layer, head)]
        if shown:  # one y scale per head: its calls compare
            lo = min(a.get_ylim()[0] for a in shown)
            hi = max(a.get_ylim()[1] for a in shown)
            for a in shown:
                a.set_ylim(lo, hi)
    for a in axes.ravel():  # every panel shows the same key frames; a head's panels share y
        spec = a.get_subplotspec()
        a.tick_params(labelbottom=spec.is_last_row(), labelleft=spec.is_first_col() or not turned)
    c.outer_labels(axes.ravel(), "key frame", c.METRIC_SHORT[metric].split(" (")[0])
    first = views[0]
    legend = [c.own_handle(first.query_frames, base)] + ([c.gap_handle()] if gaps else [])
    layout = "rows = heads, columns = calls" if turned else "rows = calls, columns = heads"
    return c.finish(
        fig,
        title=f"Figure 4 at every call of the last block (query frames {c.frames_text(first.query_frames, base)})",
        subtitle=c.subtitle(source, "every denoising step and the cache pass", c.METRIC_SHORT[metric], first.runs),
        legend=legend,
        caption=(f"{layout}; each head's panels share one y scale. Bars: {c.METRIC_LABELS[metric]} per key frame, "
                 "queries averaged over the last block. sink = first cache frame − mean of the cache frames between; "
                 "max@ = the largest key frame (sinkscope.stats.summaries.curve_stats)."),
    )  # fmt: skip
