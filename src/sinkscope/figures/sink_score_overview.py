"""The sink score (first cache frame − mean of the cache frames between) of every layer x
head of the last block, in one heat map (``summaries.curve_stats``: the head_stats rows
with prompt '*'); diverging colours centred on 0, values written in the cells when the
map is small enough to read them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from sinkscope.figures import common as c


def scores(view: c.View) -> pd.DataFrame:
    """Layers x heads of sink scores."""
    values = {key: view.stats(*key)["sink_score"] for key in view.curves.index}
    return pd.Series(values).unstack().sort_index().sort_index(axis=1)


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "sink_score_overview"
    frame = c.one_source(c.table(tables, "frame_attention", kind), kind)
    metric = c.option(options, "metric")
    view = c.figure4_view(frame, c.option(options, "step"), metric)
    grid = scores(view)
    layers, heads = list(grid.index), list(grid.columns)
    cell = c.cell_size(len(layers), len(heads), largest=0.55, smallest=0.2, budget=10)
    given = ax is not None
    width, height = len(heads) * cell + 2.2, len(layers) * cell + 1.0
    fig = ax.figure if given else c.new_figure(max(5.5, width), max(3.0, height))
    ax = ax if given else fig.add_subplot()
    values = grid.to_numpy(dtype=float)
    cmap, norm = c.colour_scale(values, "signed")
    image = c.heat(ax, values, cmap, norm)
    if cell >= 0.45 and values.size <= 400:
        c.annotate_cells(ax, values, ".2f" if metric != "prob_mass" else ".3f", norm, cmap,
                         fontsize=6.5 if metric == "prob_mass" else 7)  # fmt: skip
    c.set_label_ticks(ax, [f"H{h + 1}" for h in heads], length=len(heads) * cell)
    c.set_label_ticks(ax, [c.layer_label(layer) for layer in layers], axis="y", length=len(layers) * cell)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    bar = fig.colorbar(image, ax=ax, pad=0.02, shrink=min(1.0, max(0.5, 8 / max(len(layers), 1))))
    bar.set_label(f"sink score ({c.METRIC_SHORT[metric].split(' (')[0]})")
    if given:
        ax.set_title(f"sink score · {source} · {view.call}", fontsize=9)
        return fig
    return c.finish(
        fig,
        title="Sink score of every head",
        subtitle=c.subtitle(source, view.call, c.METRIC_SHORT[metric], view.runs),
        caption=("Sink score = first cache frame − mean of the cache frames between the first and the last, on each "
                 "head's curve of the last block (sinkscope.stats.summaries.curve_stats; head_stats rows with prompt_id '*'). "
                 "Red: the first frame draws more than the middle."),
    )  # fmt: skip


