"""First − middle (head_stats ``sink_score``: the first cache frame minus the mean of the
cache frames between) of every layer x head of the last block, in one heat map
(``summaries.curve_stats``: the head_stats rows with prompt '*'); diverging colours
centred on 0, clipped to the 2nd–98th percentile (an outlier would whiten every other
cell; the clipped range is on the colour bar) and logarithmic beyond the median magnitude
when a few heads' scores are far larger than the rest (``colours.colour_scale``), true
values written in the cells when the map is small enough to read them. The score is a name, not a verdict: heads whose
head_class is sink are outlined, and only they are called sinks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from matplotlib.patches import Patch, Rectangle

from sinkscope.figures.colours import (
    annotate_cells,
    cell_size,
    colour_scale,
    colourbar,
    heat,
    scale_sentence,
)
from sinkscope.figures.layout import finish, new_figure, set_label_ticks
from sinkscope.figures.style import option
from sinkscope.figures.text import METRIC_SHORT, spread_note, subtitle
from sinkscope.figures.views import View, figure4_view, head_classes, one_source, table
from sinkscope.naming import head_label, layer_label

SINK_EDGE = "black"


def scores(view: View, name: str = "sink_score") -> pd.DataFrame:
    """Layers x heads of one statistic (first − middle by default)."""
    values = {key: view.stats(*key)[name] for key in view.curves.index}
    return pd.Series(values).unstack().sort_index().sort_index(axis=1)


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "sink_score_overview"
    frame = one_source(table(tables, "frame_attention", kind), kind)
    metric = option(options, "metric")
    view = figure4_view(frame, option(options, "step"), metric)
    classes, classes_from = head_classes(tables.get("head_diagnostics"), frame, view)
    grid = scores(view)
    layers, heads = list(grid.index), list(grid.columns)
    cell = cell_size(len(layers), len(heads), largest=0.55, smallest=0.2, budget=10)
    given = ax is not None
    width, height = len(heads) * cell + 2.4, len(layers) * cell + 1.0
    fig = ax.figure if given else new_figure(max(5.5, width), max(3.2, height))
    ax = ax if given else fig.add_subplot()
    values = grid.to_numpy(dtype=float)
    cmap, norm = colour_scale(values, "signed")
    image = heat(ax, values, cmap, norm)
    if cell >= 0.45 and values.size <= 400:
        annotate_cells(ax, values, ".2f" if metric != "prob_mass" else ".3f", norm, cmap,
                       fontsize=6.5 if metric == "prob_mass" else 7)  # fmt: skip
    sinks = [(i, j) for i, layer in enumerate(layers) for j, head in enumerate(heads)
             if classes.get((int(layer), int(head))) == "sink"]  # fmt: skip
    for i, j in sinks:
        box = Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor=SINK_EDGE, lw=1.6, zorder=4)
        box.set_gid(f"sink-head-{head_label(int(layers[i]), int(heads[j]))}")
        ax.add_patch(box)
    set_label_ticks(ax, [f"H{h + 1}" for h in heads], length=len(heads) * cell)
    set_label_ticks(ax, [layer_label(layer) for layer in layers], axis="y", length=len(layers) * cell)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    short = METRIC_SHORT[metric].split(" (")[0]
    colourbar(fig, image, values, f"first − middle ({short})", fontsize=8.5, ax=ax, pad=0.02,
              shrink=min(1.0, max(0.5, 8 / max(len(layers), 1))))  # fmt: skip
    if given:
        ax.set_title(f"first − middle · {source} · {view.call}", fontsize=9)
        return fig
    spread = spread_note((view.run_std(int(a), int(b), "sink_score") for a, b in view.curves.index), view.runs,
                         "a head's first − middle")  # fmt: skip
    legend = [Patch(facecolor="none", edgecolor=SINK_EDGE, lw=1.6,
                    label=f"sink-class head ({len(sinks)} of {values.size})")]  # fmt: skip
    baseline = " Uniform attention gives 0 (every frame the same share)." if metric == "prob_mass" else ""
    return finish(
        fig,
        title="First cache frame − middle cache frames, every head",
        subtitle=subtitle(source, view.call, METRIC_SHORT[metric], view.runs, "spread in the caption"),
        legend=legend,
        caption=("First − middle = the first cache frame − the mean of the cache frames between the first and the last, "
                 "on each head's curve of the last block (head_stats sink_score, sinkscope.stats.summaries.curve_stats; "
                 "rows with prompt_id '*'). Red: the first frame draws more than the middle. Outlined: the heads whose "
                 f"class is sink ({classes_from}); no other head is called a sink. Cells print true values. "
                 f"{scale_sentence(norm)}{baseline} Spread: {spread}."),
    )  # fmt: skip
