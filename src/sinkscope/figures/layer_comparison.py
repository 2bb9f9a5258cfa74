"""Every layer at once: a layers x key frames heat map of the head-averaged curve of the
last block, and a few chosen layers (``highlight_layers``, else up to six spread evenly)
as curves with a ±1 std band over heads. The query block's own frames are boxed in the
map and shaded behind the curves; frames not in the KV cache are grey / gaps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from sinkscope.figures import common as c

MOST_CURVES = 6


def chosen_layers(layers: list[int], highlight: list[int] | None) -> list[int]:
    if highlight:
        chosen = [layer for layer in highlight if layer in layers]
        if chosen:
            return chosen
    return c.evenly(layers, MOST_CURVES)


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "layer_comparison"
    if ax is not None:
        raise ValueError(f"{kind} has two panels; it draws its own figure (leave ax out)")
    frame = c.one_source(c.table(tables, "frame_attention", kind), kind)
    metric, base = c.option(options, "metric"), int(c.option(options, "frame_base"))
    view = c.figure4_view(frame, c.option(options, "step"), metric)
    layers = view.layers
    frames = view.frames.astype(int)
    means = pd.DataFrame({layer: view.layer_mean(layer) for layer in layers}).T.reindex(columns=frames)
    row_h = c.cell_size(len(layers), 1, largest=0.32, smallest=0.16, budget=8)
    width = min(13.0, max(8.0, 0.42 * len(frames) + 3.5))
    map_h = max(1.8, row_h * len(layers) + 0.6)
    fig = c.new_figure(width, map_h + 3.6)
    top, bottom = fig.subplots(2, 1, height_ratios=[map_h, 3.6])
    cmap, norm = c.colour_scale(means.to_numpy(), metric)
    image = c.heat(top, means.to_numpy(dtype=float), cmap, norm)
    top.set_xlim(frames[0] - 0.5, frames[-1] + 0.5)
    c.outline_frames(top, view.query_frames, (len(layers) - 0.5, -0.5), gid="own-block-map")
    c.set_label_ticks(top, [c.layer_label(layer) for layer in layers], axis="y", length=map_h)
    c.set_frame_ticks(top, frames, base, length=width - 2)
    top.set_ylabel("layer")
    top.set_title("head-averaged, every layer", fontsize=9.5)
    # Beside both panels (so their key frames line up), as tall as the map.
    bar = fig.colorbar(image, ax=[top, bottom], pad=0.01, shrink=map_h / (map_h + 3.6), anchor=(0.0, 1.0),
                       aspect=max(6, 3 * map_h))  # fmt: skip
    bar.set_label(f"head-averaged\n{c.METRIC_SHORT[metric]}", fontsize=8.5)

    chosen = chosen_layers(layers, options.get("highlight_layers"))
    colors = c.layer_colors(chosen)
    gaps = c.mark_gaps(bottom, frames, [f for f in frames if np.isnan(means[f]).all()], gid="gap-curves")
    c.mark_own(bottom, view.query_frames, gid="own-block-curves")
    handles = []
    for layer in chosen:
        mean, std = view.layer_mean(layer).reindex(frames), view.layer_std(layer).reindex(frames)
        (line,) = bottom.plot(frames, mean.to_numpy(), "o-", color=colors[layer], lw=1.6, ms=3.5, zorder=3)
        line.set_gid(f"curve-{c.layer_label(layer)}")
        bottom.fill_between(frames, (mean - std).to_numpy(), (mean + std).to_numpy(), color=colors[layer], alpha=0.08,
                            lw=0, zorder=2)  # fmt: skip
        handles.append(c.line_handle(colors[layer], c.layer_label(layer), marker="o", ms=3.5))
    bottom.axhline(0, color="0.3", lw=0.6)
    bottom.set_xlim(frames[0] - 0.5, frames[-1] + 0.5)
    c.set_frame_ticks(bottom, frames, base, length=width - 2)
    bottom.set_xlabel("key frame")
    bottom.set_ylabel(f"head-averaged\n{c.METRIC_SHORT[metric]}")
    bottom.set_title(f"chosen layers, ±1 std over heads ({len(chosen)} of {len(layers)})", fontsize=9.5)
    legend = handles + [c.own_handle(view.query_frames, base)] + ([c.gap_handle()] if gaps else [])
    return c.finish(
        fig,
        title=f"Attention of the last block across layers (query frames {c.frames_text(view.query_frames, base)})",
        subtitle=c.subtitle(source, view.call, c.METRIC_SHORT[metric], view.runs),
        legend=legend,
        caption=("Top: every layer's head-averaged curve (dashed box: the block's own frames; grey: not in the KV "
                 "cache). Bottom: chosen layers (config figures.highlight_layers, else spread evenly) with a ±1 std "
                 "band over heads."),
    )  # fmt: skip
