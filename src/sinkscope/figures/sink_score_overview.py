"""First − middle (head_stats ``sink_score``: the first cache frame minus the mean of the
cache frames between) of every layer x head of the last block, in one heat map
(``summaries.curve_stats``: the head_stats rows with prompt '*'); diverging colours
centred on 0, clipped to the 2nd–98th percentile (an outlier would whiten every other
cell; the clipped range is on the colour bar) and logarithmic beyond the median magnitude
when a few heads' scores are far larger than the rest (``colours.colour_scale``), true
values written in the cells when the map is small enough to read them.

It draws softmax mass unless asked for logits (``metric``): a head's first − middle of
mean logits says nothing about where its attention goes (its softmax weighs the logits
against every visible frame, own block included), so a head with the first frame's logits
far above the middle can put almost none of its mass there. Heads whose colour points the
other way than the first frame's mass against uniform (``views.disagrees``) are marked
and listed in the caption with their numbers. The score is a name, not a verdict: heads
whose head_class is sink are outlined, and only they are called sinks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
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
from sinkscope.figures.marks import DISAGREE_MARK, disagree_handle
from sinkscope.figures.style import option
from sinkscope.figures.text import METRIC_SHORT, against_mass, listed, spread_note, subtitle
from sinkscope.figures.views import (
    DISAGREE_SHARE,
    View,
    disagrees,
    figure4_view,
    first_frame_mass,
    head_classes,
    mass_view,
    one_source,
    table,
)
from sinkscope.naming import head_label, layer_label
from sinkscope.stats.summaries import BORDERLINE

SINK_EDGE = "black"
DEFAULT_METRIC = "prob_mass"  # the figure's own default (config figures.metric does not apply)


def scores(view: View, name: str = "sink_score") -> pd.DataFrame:
    """Layers x heads of one statistic (first − middle by default)."""
    values = {key: view.stats(*key)[name] for key in view.curves.index}
    return pd.Series(values).unstack().sort_index().sort_index(axis=1)


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "sink_score_overview"
    frame = one_source(table(tables, "frame_attention", kind), kind)
    metric, base = options.get("metric") or DEFAULT_METRIC, int(option(options, "frame_base"))
    view = figure4_view(frame, option(options, "step"), metric)
    mass = mass_view(frame, view)
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
        annotate_cells(
            ax,
            values,
            ".2f" if metric != "prob_mass" else ".3f",
            norm,
            cmap,
            fontsize=6.5 if metric == "prob_mass" else 7,
        )
    sinks = [
        (i, j)
        for i, layer in enumerate(layers)
        for j, head in enumerate(heads)
        if classes.get((int(layer), int(head))) == "sink"
    ]
    for i, j in sinks:
        box = Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor=SINK_EDGE, lw=1.6, zorder=4)
        box.set_gid(f"sink-head-{head_label(int(layers[i]), int(heads[j]))}")
        ax.add_patch(box)
    # Borderline heads (sink?: the runs straddle the threshold) dashed, apart from the sinks.
    maybe = [
        (i, j)
        for i, layer in enumerate(layers)
        for j, head in enumerate(heads)
        if classes.get((int(layer), int(head))) == "sink" + BORDERLINE
    ]
    for i, j in maybe:
        box = Rectangle(
            (j - 0.45, i - 0.45), 0.9, 0.9, fill=False, edgecolor=SINK_EDGE, lw=1.2, ls=(0, (2, 1.5)), zorder=4
        )
        box.set_gid(f"borderline-sink-head-{head_label(int(layers[i]), int(heads[j]))}")
        ax.add_patch(box)
    marked = []
    for i, layer in enumerate(layers):
        for j, head in enumerate(heads):
            if not np.isfinite(values[i, j]):
                continue
            first = first_frame_mass(mass, int(layer), int(head))
            if disagrees(values[i, j], first):
                label = head_label(int(layer), int(head))
                # A cross in the cell's upper right corner, clear of the printed value.
                (cross,) = ax.plot([j + 0.3], [i - 0.3], ms=max(4.0, 16 * cell), zorder=5, **DISAGREE_MARK)
                cross.set_gid(f"disagree-{label}")
                said = against_mass(label, values[i, j], metric, first.frame, first.mass, first.uniform, base)
                marked.append((label, said, norm(values[i, j]) - 0.5))
    marked.sort(key=lambda item: -abs(item[2]))  # the most striking colours first: the caption details those
    marked = [item[:2] for item in marked]
    set_label_ticks(ax, [f"H{h + 1}" for h in heads], length=len(heads) * cell)
    set_label_ticks(ax, [layer_label(layer) for layer in layers], axis="y", length=len(layers) * cell)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    words = "softmax mass (prob_mass)" if metric == "prob_mass" else "mean logit (logit_mean)"
    colourbar(
        fig,
        image,
        values,
        f"first − middle of the\n{words}",
        fontsize=8.5,
        ax=ax,
        pad=0.02,
        shrink=min(1.0, max(0.5, 8 / max(len(layers), 1))),
    )
    if given:
        ax.set_title(f"first − middle of the {words} · {source} · {view.call}", fontsize=9)
        return fig
    spread = spread_note(
        (view.run_std(int(a), int(b), "sink_score") for a, b in view.curves.index), view.runs, "a head's first − middle"
    )
    legend = [
        Patch(facecolor="none", edgecolor=SINK_EDGE, lw=1.6, label=f"sink-class head ({len(sinks)} of {values.size})")
    ]
    if maybe:
        legend.append(
            Patch(
                facecolor="none",
                edgecolor=SINK_EDGE,
                lw=1.2,
                ls=(0, (2, 1.5)),
                label=f"borderline: sink? ({len(maybe)})",
            )
        )
    if marked:
        legend.append(disagree_handle(f"colour disagrees with the mass on the first frame ({len(marked)})"))
    if metric == "prob_mass":
        colour = (
            "Red: the first cache frame gets more softmax mass (prob_mass) than the mean of the middle cache "
            "frames; blue: less; 0 = the same share (as uniform attention gives)."
        )
    else:
        colour = (
            "Red: the first cache frame's mean pre-softmax logit (logit_mean) is above the mean of the middle "
            "cache frames'; blue: below. This is a statement about logits, not about attention: the softmax mass "
            "of a frame depends on its logits against every visible frame (own block included), and the table's "
            "prob_mass rows say where the attention goes."
        )
    crosses = (
        (
            f" Crossed ({len(marked)} heads): the colour points the other way than the first frame's softmax mass "
            "against uniform attention (red although that frame gets less than uniform, blue although it gets more, "
            f"by at least {DISAGREE_SHARE:.0%} of uniform): {listed(marked)}."
        )
        if marked
        else (" No head's colour points the other way than the first frame's softmax mass against uniform.")
    )
    return finish(
        fig,
        title=f"First cache frame − middle cache frames of the {words.split(' (')[0]}, every head",
        subtitle=subtitle(source, view.call, METRIC_SHORT[metric], view.runs, "spread in the caption"),
        legend=legend,
        caption=(
            "First − middle = the first cache frame − the mean of the cache frames between the first and the last, "
            f"on each head's curve of the last block in {words} (head_stats sink_score of the rows with metric "
            f"{metric} and prompt_id '*'; sinkscope.stats.summaries.curve_stats). {colour}{crosses} Outlined: the "
            f"heads whose class is sink ({classes_from}); dashed: borderline sink? (the runs straddle the "
            "threshold); no other head is called a sink. Cells print true values. "
            f"{scale_sentence(norm)} Spread: {spread}."
        ),
    )
