"""How spread each head's attention is: normalized entropy over key frames
(``entropy_frames``) and over key tokens (``entropy_tokens``) of every layer x head of
the last block (head_diagnostics), 0 = one frame / token takes everything, 1 = uniform;
and the per-layer means beside them, with the typical spread between runs of a head
(the layer's mean of head_diagnostics ``*_run_std``) as error bars."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from sinkscope.figures.colours import cell_size, colour_scale, heat
from sinkscope.figures.layout import finish, new_figure, set_label_ticks
from sinkscope.figures.marks import line_handle, spread_handle
from sinkscope.figures.style import option
from sinkscope.figures.text import call_label, subtitle
from sinkscope.figures.views import one_source, step_of, table
from sinkscope.naming import layer_label

COLUMNS = (("entropy_frames", "over key frames"), ("entropy_tokens", "over key tokens"))


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "entropy_overview"
    if ax is not None:
        raise ValueError(f"{kind} has three panels; it draws its own figure (leave ax out)")
    diagnostics = one_source(table(tables, "head_diagnostics", kind), kind)
    step = option(options, "step")
    pass_, index = step_of(diagnostics, step)
    rows = diagnostics[(diagnostics["pass"] == pass_) & (diagnostics["step"] == index)]
    call = call_label(pass_, index, float(rows["timestep"].iloc[0]))
    grids = {
        name: rows.pivot_table(index="layer", columns="head", values=name, aggfunc="first", dropna=False)
        for name, _ in COLUMNS
    }
    layers = sorted(rows["layer"].unique())
    heads = sorted(rows["head"].unique())
    grids = {name: g.reindex(index=layers, columns=heads) for name, g in grids.items()}
    cell = cell_size(len(layers), len(heads), largest=0.42, smallest=0.15, budget=6.5)
    map_w, map_h = len(heads) * cell, len(layers) * cell
    fig = new_figure(2 * map_w + 2.4 + 2.2, max(2.6, map_h + 1.0))
    axes = fig.subplots(1, 3, width_ratios=[map_w, map_w, 1.8], sharey=True)
    cmap, norm = colour_scale([], "entropy")
    image = None
    for ax_, (name, what) in zip(axes, COLUMNS):
        values = grids[name].to_numpy(dtype=float)
        image = heat(ax_, values, cmap, norm)
        ax_.set_title(f"{name}\n({what})", fontsize=9.5)
        set_label_ticks(ax_, [f"H{h + 1}" for h in heads], length=map_w)
        ax_.set_xlabel("head")
        if np.isnan(values).all():
            ax_.text(
                0.5,
                0.5,
                "not captured\n(no query_stats)",
                transform=ax_.transAxes,
                ha="center",
                va="center",
                fontsize=9,
                color="0.2",
                bbox=dict(facecolor="white", edgecolor="0.6"),
            )
    set_label_ticks(axes[0], [layer_label(layer) for layer in layers], axis="y", length=map_h)
    axes[0].set_ylabel("layer")
    summary = axes[2]
    y = np.arange(len(layers))
    runs = int(rows["runs"].max())
    spread = False
    for (name, _), color, marker, shift in zip(COLUMNS, ("#2E86AB", "#C73E1D"), ("o", "s"), (-0.12, 0.12)):
        means = grids[name].mean(axis=1).to_numpy()
        (line,) = summary.plot(means, y, marker=marker, color=color, lw=1.2, ms=3, label=name)
        line.set_gid(f"layer-mean-{name}")
        column = f"{name}_run_std"
        if runs >= 2 and column in rows:
            std = rows.groupby("layer")[column].mean().reindex(layers).to_numpy(dtype=float)
            keep = np.isfinite(means) & np.isfinite(std)
            if keep.any():
                bars = summary.errorbar(
                    means[keep], y[keep] + shift, xerr=std[keep], fmt="none", ecolor=color, elinewidth=0.9, capsize=1.8
                )
                for child in bars.get_children():
                    child.set_gid(f"spread-{name}")
                spread = True
    summary.set_xlim(0, 1.02)
    summary.set_xlabel("mean over heads")
    summary.set_title("per layer", fontsize=9.5)
    # Its own layer labels: the maps' are on the left, far from these points.
    summary.tick_params(labelleft=True)
    summary.set_ylabel("layer")
    set_label_ticks(summary, [layer_label(layer) for layer in layers], axis="y", length=map_h)
    bar = fig.colorbar(image, ax=list(axes[:2]), pad=0.02, shrink=min(1.0, max(0.5, 8 / max(len(layers), 1))))
    bar.set_label("normalized entropy")
    legend = [
        line_handle("#2E86AB", "entropy_frames (layer mean)", marker="o", ms=3),
        line_handle("#C73E1D", "entropy_tokens (layer mean)", marker="s", ms=3),
    ]
    legend += [spread_handle("±1 std between runs (mean over the layer's heads)")] if spread else []
    return finish(
        fig,
        title="Entropy of every head's attention in the last block",
        subtitle=subtitle(
            source,
            call,
            "normalized entropy (head_diagnostics)",
            runs,
            "error bars: a head's std between runs, layer mean",
        ),
        legend=legend,
        caption=(
            "entropy_frames: entropy of each query frame's key-frame distribution / ln(key frames); "
            "entropy_tokens: entropy over every key token / ln(key tokens); both averaged over the block's "
            "queries and runs. 0 = all on one frame / token, 1 = uniform. Error bars: the mean over the layer's "
            "heads of each head's std between runs (head_diagnostics *_run_std)."
        ),
    )
