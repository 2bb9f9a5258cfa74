"""One layer, every head: query frame x key frame of the whole generation at one call of
every block (grey = not visible to that query), on one colour scale (diverging around 0
for logits), clipped to percentiles (the clipped range on the colour bar); dashed
squares: each block's own frames. ``video_frames`` expands latent frames to the video
frames they decode to (Wan's VAE: 4 per latent, frame 0 alone). The caption gives the
uniform share of each block's queries and the spread between runs. Each panel is titled
with its head's class (head_diagnostics, at the chosen call of the last block)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from sinkscope.figures.colours import colour_scale, colourbar, heat, scale_sentence
from sinkscope.figures.layout import (
    finish,
    outer_labels,
    outer_ticks,
    panel_columns,
    panel_grid,
    set_frame_ticks,
)
from sinkscope.figures.marks import nan_handle, outline_frames
from sinkscope.figures.style import option
from sinkscope.figures.text import (
    METRIC_LABELS,
    METRIC_SHORT,
    number,
    spread_note,
    subtitle,
)
from sinkscope.figures.views import (
    VAE_TEMPORAL_STRIDE,
    block_call_rows,
    block_frames,
    figure4_view,
    head_classes,
    latent_of_video_frame,
    one_source,
    run_count,
    table,
)
from sinkscope.naming import layer_label


def matrices(frame: pd.DataFrame, step, metric: str) -> tuple[np.ndarray, list[int], dict[str, Any]]:
    """[heads, F, F] run-averaged query x key matrices of one call of every block (NaN = not visible)."""
    rows, call = block_call_rows(frame, step)
    cells = rows.groupby(["head", "query_frame", "key_frame"], observed=True)[metric].mean()
    per_run = rows.groupby(["prompt_id", "seed", "head", "query_frame", "key_frame"], observed=True)[metric].mean()
    spread = per_run.groupby(["head", "query_frame", "key_frame"], observed=True).std(ddof=1)
    visible = rows.groupby(["block", "query_frame"], observed=True)["key_frame"].nunique()
    heads = sorted(int(h) for h in rows["head"].unique())
    count = int(max(rows["query_frame"].max(), rows["key_frame"].max())) + 1
    out = np.full((len(heads), count, count), np.nan)
    level = cells.index.get_level_values
    h = level("head").map({head: i for i, head in enumerate(heads)}).to_numpy()
    out[h, level("query_frame").to_numpy(), level("key_frame").to_numpy()] = cells.to_numpy()
    uniform = {int(b): 1.0 / int(n) for (b, _), n in visible.items()}
    return (
        out,
        heads,
        {
            "call": call,
            "runs": run_count(rows),
            "blocks": block_frames(rows),
            "spread": spread.to_numpy(dtype=float),
            "uniform": uniform,
        },
    )


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, layer: int, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "query_key_maps"
    if ax is not None:
        raise ValueError(f"{kind} is a grid of panels; it draws its own figure (leave ax out)")
    frame = one_source(table(tables, "frame_attention", kind), kind)
    metric, base = option(options, "metric"), int(option(options, "frame_base"))
    rows = frame[frame["layer"] == layer]
    values, heads, info = matrices(rows, option(options, "step"), metric)
    # The classes are a statistic of the last block's call (the Figure 4 view's).
    classes, classes_from = head_classes(
        tables.get("head_diagnostics"), rows, figure4_view(rows, option(options, "step"), metric)
    )
    count = values.shape[1]
    axis_name, blocks = "frame", info["blocks"]
    if options.get("video_frames"):
        video = np.arange(VAE_TEMPORAL_STRIDE * (count - 1) + 1)
        index = latent_of_video_frame(video)
        values = values[:, index][:, :, index]
        count, axis_name = len(video), "video frame"
        blocks = {b: [v for v in video if index[v] in fs] for b, fs in blocks.items()}
    ncols = panel_columns(len(heads))
    size = 2.9 if ncols <= 4 else 2.4 if ncols <= 6 else 2.0
    fig, axes = panel_grid(len(heads), ncols=ncols, panel=(size, size), extra=(0.8, 0))
    cmap, norm = colour_scale(values, metric)
    image = None
    for ax_, head, matrix in zip(axes, heads, values):
        image = heat(ax_, matrix, cmap, norm, origin="lower")
        for b, fs in blocks.items():
            outline_frames(ax_, fs, (min(fs) - 0.5, max(fs) + 0.5), gid=f"own-block-H{head + 1}-{b}", color="0.15")
        klass = classes.get((layer, head))
        ax_.set_title(
            f"H{head + 1} · {klass or 'class n/a'}", fontsize=9, fontweight="bold" if klass == "sink" else "normal"
        )
        set_frame_ticks(ax_, range(count), base, length=size - 0.6)
        set_frame_ticks(ax_, range(count), base, axis="y", length=size - 0.6)
    for patch in [p for a in axes for p in a.patches]:
        patch.set_linewidth(0.6)
    outer_ticks(axes)
    outer_labels(axes, f"key {axis_name}", f"query {axis_name}")
    colourbar(fig, image, values, METRIC_SHORT[metric], ax=axes, pad=0.01, shrink=0.8, aspect=30)
    uniform = info["uniform"]
    baseline = ""
    if metric == "prob_mass" and uniform:
        first, last = min(uniform), max(uniform)
        baseline = (
            f" Uniform attention gives a visible frame on average 1 / visible frames: "
            f"{number(uniform[first], 'prob_mass')} in block {first} … {number(uniform[last], 'prob_mass')} "
            f"in block {last}."
        )
    return finish(
        fig,
        title=f"Layer {layer_label(layer)} (index {layer}): query x key {axis_name} attention of every head",
        subtitle=subtitle(source, info["call"], METRIC_SHORT[metric], info["runs"], "spread in the caption"),
        legend=[
            nan_handle("not visible to the query"),
            Patch(facecolor="none", edgecolor="0.15", ls="--", label="a block's own frames"),
        ],
        caption=(
            f"Each cell: {METRIC_LABELS[metric]} of a query frame on a key frame, query tokens and runs "
            f"averaged (the frame_attention column {metric}); {spread_note(info['spread'], info['runs'])}. "
            f"Titles: each head's class ({classes_from}, at the last block's call; bold: sink). "
            f"{scale_sentence(norm)}{baseline}"
        ),
    )
