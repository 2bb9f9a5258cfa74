"""Every layer at once: a layers x key frames heat map of the head-averaged curve of the
last block (colours clipped to percentiles, the clipped range on the colour bar), and a
few chosen layers (``highlight_layers``, else up to six spread evenly) as small multiples
below it: the head-averaged curve with a ±1 std band between runs and, on softmax mass,
the uniform baseline. The query block's own frames are boxed in the map and shaded behind
the curves; frames not in the KV cache are grey / gaps.

Softmax masses share one scale (map and panels). Logits do not: a query's attention is
unchanged when all its logits shift together, so a layer's level says nothing and the
layers' levels differ by hundreds in a trained model (the default demo's L3 near +150,
its L1 near 0). On logits the map shows each layer's curve minus its mean over the
visible frames, and each panel has its own y scale."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from sinkscope.figures.colours import (
    PANEL_COLORS,
    cell_size,
    colour_scale,
    colourbar,
    darker,
    heat,
    scale_sentence,
)
from sinkscope.figures.layout import (
    LOGIT_LEVEL_NOTE,
    finish,
    new_figure,
    outer_labels,
    panel_y_scales,
    set_frame_ticks,
    set_label_ticks,
)
from sinkscope.figures.marks import (
    band_handle,
    gap_handle,
    mark_gaps,
    mark_own,
    outline_frames,
    own_handle,
    uniform_handle,
    uniform_steps,
)
from sinkscope.figures.style import option
from sinkscope.figures.text import METRIC_LABELS, METRIC_SHORT, frames_text, spread_note, subtitle
from sinkscope.figures.views import evenly, figure4_view, one_source, table
from sinkscope.naming import layer_label

MOST_CURVES = 6
CURVE_COLOR = PANEL_COLORS[0]


def chosen_layers(layers: list[int], highlight: list[int] | None) -> list[int]:
    if highlight:
        chosen = [layer for layer in highlight if layer in layers]
        if chosen:
            return chosen[:MOST_CURVES]
    return evenly(layers, MOST_CURVES)


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "layer_comparison"
    if ax is not None:
        raise ValueError(f"{kind} has several panels; it draws its own figure (leave ax out)")
    frame = one_source(table(tables, "frame_attention", kind), kind)
    metric, base = option(options, "metric"), int(option(options, "frame_base"))
    view = figure4_view(frame, option(options, "step"), metric)
    layers = view.layers
    frames = view.frames.astype(int)
    means = pd.DataFrame({layer: view.layer_mean(layer) for layer in layers}).T.reindex(columns=frames)
    chosen = chosen_layers(layers, options.get("highlight_layers"))
    ncols = min(3, len(chosen))
    nrows = math.ceil(len(chosen) / ncols)
    row_h = cell_size(len(layers), 1, largest=0.32, smallest=0.16, budget=8)
    width = min(13.0, max(8.5, 0.42 * len(frames) + 3.5))
    map_h = max(1.8, row_h * len(layers) + 0.6)
    curve_h = 2.3
    fig = new_figure(width, map_h + nrows * curve_h + 0.3)
    grid = fig.add_gridspec(1 + nrows, ncols, height_ratios=[map_h] + [curve_h] * nrows)
    top = fig.add_subplot(grid[0, :])
    centred = metric != "prob_mass"
    # The level of a layer's logits does not change its attention (see the module's text).
    values = (means.sub(means.mean(axis=1), axis=0) if centred else means).to_numpy(dtype=float)
    cmap, norm = colour_scale(values, metric)
    image = heat(top, values, cmap, norm)
    top.set_xlim(frames[0] - 0.5, frames[-1] + 0.5)
    outline_frames(top, view.query_frames, (len(layers) - 0.5, -0.5), gid="own-block-map")
    set_label_ticks(top, [layer_label(layer) for layer in layers], axis="y", length=map_h)
    set_frame_ticks(top, frames, base, length=width - 2)
    top.set_xlabel("key frame")
    top.set_ylabel("layer")
    top.set_title("head-averaged, every layer", fontsize=9.5)
    quantity = f"head-averaged\n{METRIC_SHORT[metric]}" + ("\n− the layer's mean" if centred else "")
    colourbar(fig, image, values, quantity, fontsize=8.5, ax=top, pad=0.01, aspect=max(6, 3 * map_h))
    stds = [view.std(layer) for layer in layers]
    heat_spread = spread_note([v for s in stds if s is not None for v in s.to_numpy()], view.runs)

    axes = [fig.add_subplot(grid[1 + i // ncols, i % ncols]) for i in range(len(chosen))]
    missing = [f for f in frames if np.isnan(means[f]).all()]
    gaps = False
    for ax_, layer in zip(axes, chosen):
        label = layer_label(layer)
        gaps |= mark_gaps(ax_, frames, missing, gid=f"gap-curves-{label}")
        mark_own(ax_, view.query_frames, gid=f"own-block-curves-{label}")
        mean = view.layer_mean(layer).reindex(frames)
        std = view.std(layer)
        if std is not None:
            std = std.reindex(frames)
            band = ax_.fill_between(
                frames, (mean - std).to_numpy(), (mean + std).to_numpy(), color=CURVE_COLOR, alpha=0.25, lw=0, zorder=2
            )
            band.set_gid(f"spread-{label}")
        (line,) = ax_.plot(frames, mean.to_numpy(), "o-", color=darker(CURVE_COLOR), lw=1.5, ms=3, zorder=3)
        line.set_gid(f"curve-{label}")
        if metric == "prob_mass":
            uniform_steps(
                ax_, frames[mean.notna().to_numpy()], view.layer_baseline(layer).reindex(frames).dropna(), gid=label
            )
        if not centred:  # on logits 0 is no baseline (the level is arbitrary)
            ax_.axhline(0, color="0.3", lw=0.6)
        ax_.set_xlim(frames[0] - 0.5, frames[-1] + 0.5)
        set_frame_ticks(ax_, frames, base, length=width / ncols - 0.6)
        ax_.grid(False, axis="x")
        ax_.set_title(f"{label} (layer {layer})", fontsize=9.5, fontweight="bold")
    panel_y_scales(axes, metric)
    outer_labels(axes, "key frame", f"head-averaged\n{METRIC_SHORT[metric].split(' (')[0]}")
    legend = [own_handle(view.query_frames, base)] + ([gap_handle()] if gaps else [])
    legend += [uniform_handle()] if metric == "prob_mass" else []
    legend += [band_handle(CURVE_COLOR)] if view.runs >= 2 else []
    asked = [int(x) for x in options.get("highlight_layers") or []]
    absent = [layer_label(x) for x in asked if x not in layers]
    picked = (
        "spread evenly"
        if not asked
        else "figures.highlight_layers"
        if not absent
        else f"figures.highlight_layers; {', '.join(absent)} not in the table"
        + ("" if set(asked) & set(layers) else ", so spread evenly")
    )
    return finish(
        fig,
        title=f"Attention of the last block across layers (query frames {frames_text(view.query_frames, base)})",
        subtitle=subtitle(source, view.call, METRIC_SHORT[metric], view.runs, "curves ±1 std between runs"),
        legend=legend,
        caption=(
            f"Top: every layer's head-averaged {METRIC_LABELS[metric]} curve"
            f"{' minus its mean over the visible frames' if centred else ''} "
            f"(dashed box: the block's own frames; grey: not in the KV cache); {heat_spread}. Below: "
            f"{len(chosen)} of {len(layers)} layers "
            f"({picked}), one panel each on {'its own' if centred else 'one'} y scale, with a ±1 std band between "
            "runs of the head-averaged curve. " + (f"{LOGIT_LEVEL_NOTE} " if centred else "") + scale_sentence(norm)
        ),
    )
