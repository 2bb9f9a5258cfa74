"""Figure 4 at every call of the last block on one page (Deep Forcing Fig. 11): rows = the
denoising steps and the cache pass, columns = the heads of ``heads``; each column (one
head) shares its y scale, so the calls compare. With more than four heads the grid turns
(rows = heads, columns = calls), so any number of heads stays a readable grid (Fig. 16).
Each title: the head's class at that call and its frame-0 excess over uniform."""

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
from sinkscope.figures.text import (
    METRIC_LABELS,
    METRIC_SHORT,
    class_text,
    frames_text,
    subtitle,
    timestep_text,
)
from sinkscope.figures.views import (
    View,
    excess_text,
    figure4_view,
    head_classes,
    last_block_calls,
    layers_of,
    mass_view,
    one_source,
    table,
)


def short_call(view: View) -> str:
    if view.pass_ == "cache":
        return f"cache pass (t={timestep_text(view.timestep)})"
    if view.step < 0:
        return "imported call"
    return f"step {view.step} (t={timestep_text(view.timestep)})"


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "figure4_steps"
    if ax is not None:
        raise ValueError(f"{kind} is a grid of panels; it draws its own figure (leave ax out)")
    frame = one_source(table(tables, "frame_attention", kind), kind)
    metric, base = option(options, "metric"), int(option(options, "frame_base"))
    heads = heads_of(options)
    frame = layers_of(frame, heads)
    views = [figure4_view(frame, call, metric) for call in last_block_calls(frame)]
    masses = [mass_view(frame, view) for view in views]
    classes = [head_classes(tables.get("head_diagnostics"), frame, view) for view in views]
    turned = len(heads) > 4
    nrows, ncols = (len(heads), len(views)) if turned else (len(views), len(heads))
    panel = (3.4, 2.4) if turned or ncols > 2 else (5.6, 2.5)
    fig = new_figure(ncols * panel[0], nrows * panel[1])
    axes = fig.subplots(nrows, ncols, squeeze=False)
    gaps = False
    for h, (label, layer, head) in enumerate(heads):
        cells = [axes[h, v] if turned else axes[v, h] for v in range(len(views))]
        color = PANEL_COLORS[h % len(PANEL_COLORS)]
        for ax_, view, mass, (known, _) in zip(cells, views, masses, classes):
            if not view.has(layer, head):
                message_panel(ax_, f"{label}: layer {layer} was not extracted")
                ax_.set_title(f"{label} · {short_call(view)}", fontsize=9, fontweight="bold")
                continue
            uniform = view.baseline(layer, head) if metric == "prob_mass" else None
            gaps |= curve_panel(
                ax_,
                view.curve(layer, head),
                view.query_frames,
                color=color,
                base=base,
                gid=f"{label}-{view.pass_}{view.step}",
                length=panel[0] - 0.7,
                markersize=2.0,
                std=view.std(layer, head),
                uniform=uniform,
            )
            ax_.set_title(
                f"{label} · {short_call(view)} · {class_text(known.get((layer, head)))}\n"
                f"{excess_text(mass, layer, head)} · max@{view.stats(layer, head)['argmax_frame'] + base}",
                fontsize=9,
            )
        shown = [a for a, v in zip(cells, views) if v.has(layer, head)]
        if shown:  # one y scale per head: its calls compare
            lo = min(a.get_ylim()[0] for a in shown)
            hi = max(a.get_ylim()[1] for a in shown)
            for a in shown:
                a.set_ylim(lo, hi)
    for a in axes.ravel():  # every panel shows the same key frames; a head's panels share y
        spec = a.get_subplotspec()
        a.tick_params(labelbottom=spec.is_last_row(), labelleft=spec.is_first_col() or not turned)
    outer_labels(axes.ravel(), "key frame", METRIC_SHORT[metric].split(" (")[0])
    first = views[0]
    legend = [own_handle(first.query_frames, base)] + ([gap_handle()] if gaps else [])
    legend += [uniform_handle()] if metric == "prob_mass" else []
    legend += [spread_handle()] if first.runs >= 2 else []
    layout = "rows = heads, columns = calls" if turned else "rows = calls, columns = heads"
    return finish(
        fig,
        title=f"Figure 4 at every call of the last block (query frames {frames_text(first.query_frames, base)})",
        subtitle=subtitle(
            source,
            "every denoising step and the cache pass",
            METRIC_SHORT[metric],
            first.runs,
            "error bars ±1 std between runs",
        ),
        legend=legend,
        caption=(
            f"{layout}; each head's panels share one y scale. Bars: {METRIC_LABELS[metric]} per key frame, "
            "queries averaged over the last block. Titles: the head's class at that call "
            f"({classes[0][1]}); frame-0 excess = softmax mass on frame 0 − its uniform share (1 / visible "
            "frames); max@ = the largest key frame (sinkscope.stats.summaries.curve_stats)."
        ),
    )
