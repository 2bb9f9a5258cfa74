"""First vs middle vs last cache frame of each layer's head-averaged curve of the last
block (``summaries.curve_stats``, the numbers of layer_stats): grouped bars for a few
layers, lines over the layers for many; ±1 std between runs (layer_stats ``*_run_std``)
as error bars or bands, and on softmax mass the uniform baseline 1 / visible frames.

It draws softmax mass unless asked for logits (``metric``): head-averaged mean logits can
stand level in a layer that puts most of its mass on frame 0. Layers whose first − middle
points the other way than the first frame's mass against uniform (``views.disagrees``; on
logits mostly) are marked above their bars and listed in the caption."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from sinkscope.figures.colours import LOG_SPAN, linear_width, plain_ticks
from sinkscope.figures.layout import finish, new_figure, set_label_ticks
from sinkscope.figures.marks import (
    DISAGREE_MARK,
    UNIFORM_STYLE,
    band_handle,
    disagree_handle,
    error_bars,
    line_handle,
    spread_handle,
    uniform_handle,
)
from sinkscope.figures.style import option
from sinkscope.figures.text import (
    METRIC_LABELS,
    METRIC_SHORT,
    against_mass,
    frames_text,
    listed,
    significant,
    subtitle,
)
from sinkscope.figures.views import (
    DISAGREE_SHARE,
    disagrees,
    figure4_view,
    first_frame_mass,
    mass_view,
    one_source,
    table,
)
from sinkscope.naming import layer_label

SERIES = (
    ("first", "first: oldest cache frame", "#2E86AB"),
    ("middle", "middle: mean of the cache frames between", "#F18F01"),
    ("last", "last: newest cache frame", "#A23B72"),
    ("own", "own: mean of the block's own frames", "#6A994E"),
)
MOST_BARS = 12
DEFAULT_METRIC = "prob_mass"  # the figure's own default (config figures.metric does not apply)


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "first_middle_last"
    frame = one_source(table(tables, "frame_attention", kind), kind)
    metric, base = options.get("metric") or DEFAULT_METRIC, int(option(options, "frame_base"))
    view = figure4_view(frame, option(options, "step"), metric)
    mass = mass_view(frame, view)
    layers = view.layers
    stats = [view.layer_stats(layer) for layer in layers]
    x = np.arange(len(layers))
    width = min(12.0, max(7.0, 0.38 * len(layers) + 2.5))
    given = ax is not None
    fig = ax.figure if given else new_figure(width, 4.0)
    ax = ax if ax is not None else fig.add_subplot()
    handles = []
    spread = view.runs >= 2
    if len(layers) <= MOST_BARS:
        bar = 0.8 / len(SERIES)
        for i, (key, label, color) in enumerate(SERIES):
            at = x + (i - (len(SERIES) - 1) / 2) * bar
            heights = [s[key] for s in stats]
            ax.bar(at, heights, bar, color=color, label=label, lw=0)
            if spread:
                error_bars(ax, at, heights, [view.run_std(layer, None, key) for layer in layers], gid=f"series-{key}")
            handles.append(Patch(facecolor=color, label=label))
    else:
        for key, label, color in SERIES:
            values = np.array([s[key] for s in stats], dtype=float)
            (line,) = ax.plot(x, values, "o-", color=color, lw=1.5, ms=3.5, label=label)
            line.set_gid(f"series-{key}")
            if spread:
                std = np.array([view.run_std(layer, None, key) for layer in layers], dtype=float)
                ax.fill_between(x, values - std, values + std, color=color, alpha=0.18, lw=0).set_gid(f"spread-{key}")
            handles.append(line_handle(color, label, marker="o", ms=3.5))
    if metric == "prob_mass":
        # Uniform attention gives each visible frame 1 / (visible frames): the first, the
        # last, the mean of the middle and of the own frames alike (key tokens counted, it
        # is the mean share of a frame).
        uniform = [1.0 / s["num_key_frames"] if s["num_key_frames"] else np.nan for s in stats]
        ax.hlines(uniform, x - 0.45, x + 0.45, **UNIFORM_STYLE).set_gid("uniform")
        handles.append(uniform_handle())
    if spread:
        handles.append(
            spread_handle()
            if len(layers) <= MOST_BARS
            else band_handle(SERIES[0][2], "±1 std between runs (a band in its line's colour)")
        )
    # Layers whose first − middle points the other way than their first frame's softmax
    # mass against uniform: a cross above the layer.
    marked, crossed = [], []
    for i, (layer, s) in enumerate(zip(layers, stats)):
        first = first_frame_mass(mass, layer)
        if disagrees(s["sink_score"], first):
            crossed.append(i)
            marked.append(
                (
                    layer_label(layer),
                    against_mass(
                        f"{layer_label(layer)} first − middle",
                        s["sink_score"],
                        metric,
                        first.frame,
                        first.mass,
                        first.uniform,
                        base,
                    ),
                )
            )
    if crossed:
        (cross,) = ax.plot(
            x[crossed],
            [1.0] * len(crossed),
            transform=ax.get_xaxis_transform(),
            clip_on=False,
            ms=7,
            zorder=6,
            **DISAGREE_MARK,
        )
        cross.set_gid("disagree")
        handles.append(disagree_handle(f"first − middle disagrees with the mass on the first frame ({len(crossed)})"))
    ax.axhline(0, color="0.3", lw=0.6)
    # Logit levels differ by hundreds between the layers of a trained model: beyond the
    # lower quartile of the values' sizes the axis turns logarithmic, so that every
    # layer's bars stay readable (a bar chart must show the smallest layer too).
    shown = np.array([s[key] for s in stats for key, _, _ in SERIES], dtype=float)
    largest = float(np.nanmax(np.abs(shown), initial=0.0))
    log_width = linear_width(shown, largest, percentile=25) if metric != "prob_mass" else None
    if log_width:
        ax.set_yscale("symlog", linthresh=log_width, linscale=1.0)
        ax.yaxis.set_major_formatter(plain_ticks())
        lowest = ax.dataLim.y0  # the bars and error bars; a log axis would round it down a decade
        ax.set_ylim(bottom=1.25 * lowest if lowest < 0 else 0.0)
    ax.set_xlim(-0.6, len(layers) - 0.4)
    set_label_ticks(ax, [layer_label(layer) for layer in layers], length=width - 1.2)
    ax.grid(False, axis="x")
    ax.set_xlabel("layer")
    ax.set_ylabel(f"head-averaged {METRIC_SHORT[metric]}")
    if given:
        ax.legend(handles=handles, fontsize=8)
        ax.set_title(f"{source} · {view.call}", fontsize=9)
        return fig
    firsts = sorted({s["first_frame"] for s in stats})
    return finish(
        fig,
        title="First, middle, last and own frames of the last block "
        f"(query frames {frames_text(view.query_frames, base)})",
        subtitle=subtitle(
            source,
            view.call,
            METRIC_SHORT[metric],
            view.runs,
            "±1 std between runs" + (" (error bars)" if len(layers) <= MOST_BARS else " (bands)"),
        ),
        legend=handles,
        caption=(
            f"Values of each layer's head-averaged {METRIC_LABELS[metric]} curve (sinkscope.stats.summaries."
            f"curve_stats: the layer_stats rows with metric {metric} and prompt_id '*', columns first, middle, "
            f"last, own): first = the oldest cache frame (frame {frames_text(firsts, base)}), last = the newest "
            "cache frame before the block, middle = mean of the cache frames between."
            + (
                " The dashed line: what uniform attention over the key tokens gives a frame (1 / visible frames)."
                if metric == "prob_mass"
                else " Mean logits are pre-softmax: a layer whose first bar stands level with the middle can still put "
                "most of its softmax mass on the first frame (the prob_mass rows say where the attention goes)."
            )
            + (
                f" Crossed ({len(marked)} layers): first − middle points the other way than the first frame's "
                "softmax mass against uniform (by at least "
                f"{DISAGREE_SHARE:.0%} of uniform): {listed(marked)}."
                if marked
                else ""
            )
            + (
                f" The y axis is logarithmic beyond ±{significant(log_width, 1)}, the lower quartile of the values' "
                f"sizes (the largest is more than {LOG_SPAN:g}x it)."
                if log_width
                else ""
            )
        ),
    )
