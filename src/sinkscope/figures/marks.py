"""What panels mark on their axes (the query block's own frames, evicted frames, uniform
baselines, spreads between runs, bars and curves) and the legend handles that name them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from sinkscope.figures.colours import GAP_COLOR, NAN_COLOR, OWN_COLOR, darker
from sinkscope.figures.layout import set_frame_ticks
from sinkscope.figures.text import frames_text, runs_of

UNIFORM_COLOR = "0.15"
UNIFORM_STYLE = dict(color=UNIFORM_COLOR, lw=1.1, ls=(0, (4, 2)), zorder=4)
SPREAD_COLOR = "0.1"
# A cell, bar or layer whose first − middle points the other way than its first frame's
# softmax mass against uniform (``views.disagrees``).
DISAGREE_MARK = dict(marker="X", color="black", markeredgecolor="white", markeredgewidth=0.6, ls="none")


# -- marks ---------------------------------------------------------------------------------------


def mark_own(
    ax: Axes, query_frames: Sequence[int], *, left: float = -0.5, width: float = 1.0, gid: str = "own-block"
) -> None:
    """A light span behind the query block's own frames (frame f covers f+left .. f+left+width)."""
    if not query_frames:
        return
    span = ax.axvspan(min(query_frames) + left, max(query_frames) + left + width, color=OWN_COLOR, zorder=0.5, lw=0)
    span.set_gid(gid)


def mark_gaps(
    ax: Axes, frames: Sequence[int], missing: Iterable[int], *, left: float = -0.5, width: float = 1.0, gid: str = "gap"
) -> bool:
    """Light grey spans over runs of key frames not in the KV cache; whether there were any."""
    runs = runs_of(missing)
    if not runs:
        return False
    for i, (a, b) in enumerate(runs):
        ax.axvspan(a + left, b + left + width, color=GAP_COLOR, zorder=0.4, lw=0).set_gid(f"{gid}-{i}")
    return True


def outline_frames(
    ax: Axes, frames: Sequence[int], rows: tuple[float, float], *, gid: str = "own-block", color: str = "black"
) -> None:
    """A dashed box around columns ``frames`` of a heat map, rows ``rows`` (data coordinates)."""
    if not frames:
        return
    box = Rectangle(
        (min(frames) - 0.5, rows[0]),
        max(frames) - min(frames) + 1,
        rows[1] - rows[0],
        fill=False,
        edgecolor=color,
        lw=1.4,
        ls=(0, (3, 2)),
        zorder=4,
        clip_on=False,
    )
    box.set_gid(gid)
    ax.add_patch(box)


def uniform_steps(
    ax: Axes, frames: Sequence[int], baseline: Sequence[float], *, gid: str, left: float = -0.5, width: float = 1.0
) -> None:
    """The uniform baseline of each visible frame as a dashed step over the frame's slot
    (flat at 1 / visible frames unless tokens were dropped; breaks where a frame is missing)."""
    frames = np.asarray(frames, dtype=float)
    values = np.asarray(baseline, dtype=float)
    xs, ys = [], []
    for f, v in zip(frames, values):
        xs += [f + left, f + left + width, np.nan]
        ys += [v, v, np.nan]
    # Consecutive equal steps join into one dashed line.
    (line,) = ax.plot(xs, ys, **UNIFORM_STYLE)
    line.set_gid(f"uniform-{gid}")


def error_bars(
    ax: Axes, x: Sequence[float], y: Sequence[float], std: Sequence[float] | None, *, gid: str, color=SPREAD_COLOR
) -> bool:
    """±1 std between runs as error bars (nothing without a spread); whether any were drawn."""
    if std is None:
        return False
    x, y, std = (np.asarray(v, dtype=float) for v in (x, y, std))
    keep = np.isfinite(y) & np.isfinite(std)
    if not keep.any():
        return False
    bars_ = ax.errorbar(
        x[keep], y[keep], yerr=std[keep], fmt="none", ecolor=color, elinewidth=0.9, capsize=1.8, zorder=3.5
    )
    for child in bars_.get_children():
        child.set_gid(f"spread-{gid}")
    return True


def curve_panel(
    ax: Axes,
    curve: pd.Series,
    query_frames: Sequence[int],
    *,
    color: str,
    base: int,
    gid: str,
    length: float | None = None,
    markersize: float = 3.0,
    std: pd.Series | None = None,
    uniform: pd.Series | None = None,
) -> bool:
    """Figure 4 bars of one head's curve: bars where a frame is visible, a line that breaks
    at missing frames, the own frames shaded, missing frames grey; ``std``: ±1 std between
    runs as error bars; ``uniform``: the uniform baseline, dashed. Whether there were gaps."""
    frames = curve.index.to_numpy().astype(int)
    values = curve.to_numpy(dtype=float)
    present = ~np.isnan(values)
    gaps = mark_gaps(ax, frames, frames[~present], gid=f"gap-{gid}")
    mark_own(ax, query_frames, gid=f"own-block-{gid}")
    bars(ax, frames[present], values[present], color=color)
    (line,) = ax.plot(frames, values, "o-", color=darker(color), lw=1.2, ms=markersize, zorder=3)
    line.set_gid(f"curve-{gid}")
    if std is not None:
        error_bars(ax, frames, values, std.reindex(curve.index).to_numpy(dtype=float), gid=gid)
    if uniform is not None:
        shown = uniform.reindex(curve.index).to_numpy(dtype=float)
        uniform_steps(ax, frames[present], shown[present], gid=gid, left=-0.45, width=0.9)
    ax.axhline(0, color="0.3", lw=0.6, zorder=2.5)
    ax.set_xlim(frames[0] - 0.6, frames[-1] + 0.6)
    ax.grid(False, axis="x")
    set_frame_ticks(ax, frames, base, length=length)
    return gaps


def bars(
    ax: Axes,
    x: Sequence[float],
    heights: Sequence[float],
    *,
    color,
    width: float = 0.8,
    alpha: float = 0.75,
    zorder: float = 2,
) -> PolyCollection:
    """Bars from 0, as one collection: one artist to draw (a grid of 40 panels of 21 bars
    draws several times faster than with Axes.bar) and one group in the SVG."""
    x, heights = np.asarray(x, dtype=float), np.asarray(heights, dtype=float)
    half = width / 2
    verts = np.stack(
        [
            np.stack([x - half, np.zeros_like(x)], 1),
            np.stack([x - half, heights], 1),
            np.stack([x + half, heights], 1),
            np.stack([x + half, np.zeros_like(x)], 1),
        ],
        axis=1,
    )
    collection = PolyCollection(verts, facecolors=color, alpha=alpha, linewidths=0, zorder=zorder)
    collection.sticky_edges.y.append(0.0)  # no margin below a bar's base, as Axes.bar
    ax.add_collection(collection, autolim=True)
    ax.autoscale_view()
    return collection


def annotate_max(ax: Axes, frame: int, value: float, base: int, fontsize: float = 8.0) -> None:
    """'max@F' above the largest bar; at the panel's edges it leans inwards."""
    lo, hi = ax.get_xlim()
    where = (frame - lo) / (hi - lo)
    ha = "left" if where < 0.1 else "right" if where > 0.9 else "center"
    ax.annotate(
        f"max@{frame + base}",
        xy=(frame, value),
        xytext=({"left": -4, "right": 4}.get(ha, 0), 3),
        textcoords="offset points",
        ha=ha,
        va="bottom" if value >= 0 else "top",
        fontsize=fontsize,
        color="darkgreen",
        fontweight="bold",
        zorder=5,
        annotation_clip=False,
    )


def headroom(ax: Axes, fraction: float = 0.14) -> None:
    """Room above (and below) the data for max@ labels."""
    lo, hi = ax.get_ylim()
    span = hi - lo or 1.0
    ax.set_ylim(lo - (fraction * span if lo < 0 else 0), hi + fraction * span)


# -- legend handles ------------------------------------------------------------------------------


def own_label(query_frames: Sequence[int], base: int) -> str:
    return f"query block's own frames ({frames_text(query_frames, base)})"


def own_handle(query_frames: Sequence[int], base: int) -> Patch:
    return Patch(facecolor=OWN_COLOR, edgecolor="none", label=own_label(query_frames, base))


def own_box_handle(query_frames: Sequence[int], base: int) -> Patch:
    return Patch(facecolor="none", edgecolor="black", ls="--", label=own_label(query_frames, base))


def gap_handle() -> Patch:
    return Patch(facecolor=GAP_COLOR, edgecolor="none", label="not in the KV cache (evicted)")


def nan_handle(label: str = "not in the KV cache") -> Patch:
    return Patch(facecolor=NAN_COLOR, edgecolor="none", label=label)


def uniform_label(what: str = "1 / visible key frames") -> str:
    return f"uniform over the key tokens seen ({what})"


def uniform_handle(label: str | None = None) -> Line2D:
    return Line2D([], [], **{**UNIFORM_STYLE, "zorder": None}, label=label or uniform_label())


def spread_handle(label: str = "±1 std between runs") -> Line2D:
    return Line2D([], [], color=SPREAD_COLOR, ls="none", marker="|", ms=9, mew=1.0, label=label)


def band_handle(color, label: str = "±1 std between runs", alpha: float = 0.25) -> Patch:
    return Patch(facecolor=color, alpha=alpha, edgecolor="none", label=label)


def line_handle(color, label: str, **kwargs: Any) -> Line2D:
    return Line2D([], [], color=color, label=label, **{"lw": 1.8, **kwargs})


def disagree_handle(label: str) -> Line2D:
    return Line2D([], [], ms=7, label=label, **DISAGREE_MARK)
