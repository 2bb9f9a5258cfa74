"""How the attention of each chosen head moves as the video grows: blocks x absolute key
frames, the softmax mass of each block's queries (averaged over its frames and the runs)
on every key frame, at one call of every block (the last denoising step by default).
Grey: a frame that is not in the KV cache (evicted); blank: not generated yet; boxes: each
block's own frames; each panel titled with its head's class (head_diagnostics). Colours
on a square-root scale clipped to the 98th percentile (the clipped range on the colour
bar); the uniform share of each block and the spread between runs in the caption."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colors as mcolors
from matplotlib.patches import Patch

from sinkscope.figures.colours import colour_scale, colourbar, heat
from sinkscope.figures.layout import (
    finish,
    message_panel,
    panels,
    set_frame_ticks,
    set_label_ticks,
)
from sinkscope.figures.marks import nan_handle, outline_frames
from sinkscope.figures.style import heads_of, option
from sinkscope.figures.text import class_text, frames_text, head_text, number, spread_note, subtitle
from sinkscope.figures.views import (
    block_call_rows,
    block_frames,
    column_std,
    figure4_view,
    head_classes,
    layers_of,
    one_source,
    run_count,
    table,
)
from sinkscope.stats.summaries import figure4_curves


def matrix(
    frame: pd.DataFrame, layer: int, head: int, step, frames: int
) -> tuple[np.ndarray, list[int], dict, np.ndarray, dict[int, float]]:
    """[blocks, frames] of prob_mass (NaN = not visible), the blocks, the block -> frames
    map, the [blocks, frames] std between runs, and each block's uniform share."""
    rows = frame[(frame["layer"] == layer) & (frame["head"] == head)]
    blocks = sorted(int(b) for b in rows["block"].unique())
    out = np.full((len(blocks), frames), np.nan)
    spread = np.full((len(blocks), frames), np.nan)
    uniform = {}
    for i, block in enumerate(blocks):
        # The Figure 4 view of that block (summaries.figure4_curves of its rows).
        curves, info = figure4_curves(rows[rows["block"] == block], step, "prob_mass", details=True)
        row = curves.iloc[0]
        out[i, row.index.to_numpy().astype(int)] = row.to_numpy(dtype=float)
        spread[i, row.index.to_numpy().astype(int)] = column_std(info["run_curves"].to_numpy(dtype=float))
        visible = int(row.notna().sum())
        uniform[block] = 1.0 / visible if visible else float("nan")  # a block without that call: no values
    return out, blocks, block_frames(rows), spread, uniform


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "attention_over_time"
    frame = one_source(table(tables, "frame_attention", kind), kind)
    base, step = int(option(options, "frame_base")), option(options, "step")
    heads = heads_of(options)
    call_rows, call = block_call_rows(frame, step)
    frames = int(max(frame["key_frame"].max(), frame["query_frame"].max())) + 1
    owns = block_frames(frame)
    blocks = len(owns)
    panel_w = min(7.5, max(3.6, 0.22 * frames + 1.2))
    panel_h = min(6.5, max(2.2, 0.22 * blocks + 1.0))
    given = ax is not None
    fig, axes = panels(
        ax,
        len(heads),
        kind=kind,
        one="head (head='L1H1')",
        ncols=min(len(heads), 3 if panel_w < 5 else 2),
        panel=(panel_w, panel_h),
        extra=(0.9, 0),
    )
    # Each head's class at the chosen call of the last block (what every figure titles a head with).
    last_call = figure4_view(layers_of(frame, heads), step, "prob_mass")
    classes, classes_from = head_classes(tables.get("head_diagnostics"), frame, last_call)
    matrices = {}
    for label, layer, head in heads:
        if ((frame["layer"] == layer) & (frame["head"] == head)).any():
            matrices[label] = matrix(frame, layer, head, step, frames)
    finite = [m[0] for m in matrices.values()]
    shown_values = np.concatenate([m.ravel() for m in finite]) if finite else np.array([])
    cmap, norm = colour_scale(shown_values, "prob_mass")
    # A square-root scale: the sink's mass would leave every other frame black on a linear one.
    norm = mcolors.PowerNorm(0.5, vmin=0.0, vmax=norm.vmax)
    evicted = False
    image = None
    for ax_, (label, layer, head) in zip(axes, heads):
        ax_.set_title(
            f"{head_text(layer, head)} · {class_text(classes.get((layer, head)))}", fontweight="bold", fontsize=9.5
        )
        if label not in matrices:
            message_panel(ax_, f"layer {layer} was not extracted")
            continue
        values, block_ids, own, _, _ = matrices[label]
        future = np.array([[k > max(own[b]) for k in range(frames)] for b in block_ids])
        shown = np.where(future, 0.0, values)
        evicted |= bool(np.isnan(values[~future]).any())
        image = heat(ax_, shown, cmap, norm, alpha=np.where(future, 0.0, 1.0))
        image.set_gid(f"over-time-{label}")
        for i, block in enumerate(block_ids):
            outline_frames(ax_, own[block], (i - 0.5, i + 0.5), gid=f"own-block-{label}-{block}", color="black")
        ax_.set_xlim(-0.5, frames - 0.5)
        ax_.set_ylim(len(block_ids) - 0.5, -0.5)
        set_frame_ticks(ax_, range(frames), base, length=panel_w - 1)
        labels = [f"{b} ({frames_text(own[b], base)})" for b in block_ids]
        set_label_ticks(ax_, labels, axis="y", length=panel_h - 0.6)
        ax_.set_xlabel("key frame")
        ax_.set_ylabel("block (its frames)")
    if image is not None:
        colourbar(
            fig,
            image,
            shown_values,
            "softmax mass (prob_mass),\nsquare-root scale",
            fontsize=9,
            ax=axes,
            pad=0.02,
            shrink=0.9 if len(axes) > 1 else 1.0,
            aspect=25,
        )
    if given:
        return fig
    spread = spread_note(
        np.concatenate([m[3].ravel() for m in matrices.values()]) if matrices else [], run_count(call_rows)
    )
    uniform = next(iter(matrices.values()))[4] if matrices else {}
    baseline = ""
    if uniform:
        first, last = min(uniform), max(uniform)
        baseline = (
            f" Uniform attention gives a visible frame on average 1 / visible frames: "
            f"{number(uniform[first], 'prob_mass')} in block {first} … {number(uniform[last], 'prob_mass')} "
            f"in block {last}."
        )
    runs = run_count(call_rows)
    legend = [nan_handle("not in the KV cache (evicted)")] if evicted else []
    legend += [
        Patch(facecolor="white", edgecolor="0.6", label="not generated yet"),
        Patch(facecolor="none", edgecolor="black", ls="--", label="the block's own frames"),
    ]
    return finish(
        fig,
        title="Where each block's queries look, block by block",
        subtitle=subtitle(source, call, "softmax mass (prob_mass)", runs, "spread in the caption"),
        legend=legend,
        caption=(
            "Each row: the softmax mass (frame_attention prob_mass) of one block's queries on each key frame, "
            "averaged over its frames and the runs (the Figure 4 view of that "
            "block, sinkscope.stats.summaries.figure4_curves); key frames are absolute frame numbers; "
            f"{spread}.{baseline} Titles: each head's class at the last block's {last_call.call} ({classes_from})."
        ),
    )
