"""Colours: the palette, colour scales clipped to percentiles, colour bars and heat maps."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib import colors as mcolors
from matplotlib import ticker as mticker
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sinkscope.figures.text import significant

PANEL_COLORS = ["#2E86AB", "#A23B72", "#F18F01", "#C73E1D", "#3B1F2B", "#6A994E"]
# Lines drawn beside a near-black reference line (variant_drift's untouched video, dashed):
# PANEL_COLORS without its near-black, and more hues, so that six edited variants and the
# reference stay apart.
VARIANT_COLORS = ["#2E86AB", "#A23B72", "#F18F01", "#C73E1D", "#6A994E", "#7B61FF", "#00A6A6", "#B8860B"]
OWN_COLOR = "#F7DFA3"  # the query block's own frames (behind the data, visible in SVG and PNG)
OWN_EDGE = "#8A5A00"
GAP_COLOR = "#E4E4E4"  # key frames not in the KV cache
NAN_COLOR = "#BDBDBD"  # heat map cells without a value (not in the cache)
CLASS_COLORS = {"sink": "#C73E1D", "local": "#2E86AB", "periodic": "#F18F01", "diffuse": "#CFCFCF"}


def darker(color: str, amount: float = 0.35) -> tuple[float, float, float]:
    rgb = np.array(mcolors.to_rgb(color))
    return tuple(rgb * (1 - amount))


def layer_colors(layers: Sequence[int]) -> dict[int, tuple]:
    cmap = matplotlib.colormaps["viridis"]
    positions = np.linspace(0.05, 0.9, max(len(layers), 1))
    return {layer: cmap(p) for layer, p in zip(layers, positions)}


# -- colour scales -------------------------------------------------------------------------------


# Colour scales are clipped to these percentiles of the values (an outlier would whiten
# every other cell), once there are enough values for percentiles to mean anything.
CLIP_PERCENTILES = (2.0, 98.0)
CLIP_FROM = 20


def colour_range(values: np.ndarray | Iterable[float], signed: bool) -> tuple[float, float]:
    """(vmin, vmax): signed values symmetric around 0 out to the larger of |2nd| and |98th|
    percentile; others from 0 to the 98th percentile (the extremes with few values)."""
    values = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
    finite = values[np.isfinite(values)]
    if not finite.size:
        return (-1.0, 1.0) if signed else (0.0, 1.0)
    lo, hi = np.percentile(finite, CLIP_PERCENTILES) if finite.size >= CLIP_FROM else (finite.min(), finite.max())
    if signed:
        vmax = float(max(abs(lo), abs(hi))) or 1.0
        return -vmax, vmax
    return 0.0, float(hi) if hi > 0 else 1.0


# A signed scale turns logarithmic beyond the values' median magnitude when its clipped
# range is more than LOG_SPAN times that magnitude: a trained model can have a few heads
# with logits in the hundreds beside most within a few units, and a linear scale would
# whiten the few-unit cells (the sink heads among them).
LOG_SPAN = 25.0


def linear_width(values: np.ndarray | Iterable[float], vmax: float, percentile: float = 50.0) -> float | None:
    """The linear half-width of a symmetric-log scale out to ``vmax``: the ``percentile``
    of the nonzero magnitudes (the median by default), to one significant digit; None
    when a linear scale reads well (``vmax`` within ``LOG_SPAN`` of it)."""
    values = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
    magnitudes = np.abs(values[np.isfinite(values) & (values != 0)])
    if magnitudes.size < CLIP_FROM:
        return None
    typical = float(f"{np.percentile(magnitudes, percentile):.1g}")
    return typical if vmax > LOG_SPAN * typical else None


def plain_ticks() -> mticker.Formatter:
    """Tick labels ±1, ±10, ±100 on a symmetric-log scale rather than ±10^0, ±10^1, ..."""
    return mticker.FuncFormatter(lambda value, _: f"{value:g}".replace("-", "−"))


def colour_scale(values: np.ndarray | Iterable[float], metric: str) -> tuple[mcolors.Colormap, mcolors.Normalize]:
    """Signed metrics (logits): diverging, centred on 0, logarithmic beyond the median
    magnitude when the values span more than ``LOG_SPAN`` of it; masses: sequential from
    0; both clipped to percentiles (``colour_range``, stated by ``colourbar``); entropies:
    0..1."""
    if metric in ("logit_mean", "sink_score", "signed"):
        vmin, vmax = colour_range(values, True)
        width = linear_width(values, vmax)
        norm = (
            mcolors.SymLogNorm(width, linscale=1.0, vmin=vmin, vmax=vmax, base=10)
            if width
            else mcolors.Normalize(vmin, vmax)
        )
        return matplotlib.colormaps["RdBu_r"].with_extremes(bad=NAN_COLOR), norm
    if metric == "entropy":
        return matplotlib.colormaps["cividis"].with_extremes(bad=NAN_COLOR), mcolors.Normalize(0.0, 1.0)
    return matplotlib.colormaps["viridis"].with_extremes(bad=NAN_COLOR), mcolors.Normalize(*colour_range(values, False))


def clip_note(values: np.ndarray | Iterable[float], norm: mcolors.Normalize) -> str:
    """'clipped to ±1.23 (2nd–98th pct)', 'clipped at 0.41 (98th pct)' when values lie
    outside the colour range, else ''."""
    values = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
    finite = values[np.isfinite(values)]
    outside = int(((finite < norm.vmin) | (finite > norm.vmax)).sum())
    if not outside:
        return ""
    if norm.vmin < 0 and np.isclose(-norm.vmin, norm.vmax):
        return f"clipped to ±{significant(norm.vmax)} (2nd–98th pct)"
    return f"clipped at {significant(norm.vmax)} (98th pct)"


def log_note(norm: mcolors.Normalize) -> str:
    """'log beyond ±2' for a symmetric-log scale, else ''."""
    return f"log beyond ±{significant(norm.linthresh, 1)}" if isinstance(norm, mcolors.SymLogNorm) else ""


def scale_sentence(norm: mcolors.Normalize) -> str:
    """The caption's sentence on the colour scale."""
    if isinstance(norm, mcolors.SymLogNorm):
        return (
            f"Colours clip at the 2nd–98th percentile and are logarithmic beyond ±{significant(norm.linthresh, 1)}, "
            f"the values' median size (they span more than {LOG_SPAN:g}x it)."
        )
    return "Colours clip at the 2nd–98th percentile."


def colourbar(
    fig: Figure,
    image,
    values: np.ndarray | Iterable[float],
    label: str,
    *,
    fontsize: float | None = None,
    **kwargs: Any,
):
    """A colour bar labelled with ``label`` and, when the scale clips or turns
    logarithmic, the clipped range (arrows at the clipped ends) and where."""
    values = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
    finite = values[np.isfinite(values)]
    norm = image.norm
    below, above = bool((finite < norm.vmin).any()), bool((finite > norm.vmax).any())
    extend = "both" if below and above else "min" if below else "max" if above else "neither"
    bar = fig.colorbar(image, extend=extend, **kwargs)
    if isinstance(norm, mcolors.SymLogNorm):
        bar.formatter = plain_ticks()
        bar.update_ticks()
    note = ", ".join(n for n in (clip_note(values, norm), log_note(norm)) if n)
    bar.set_label(label + (f"\n{note}" if note else ""), fontsize=fontsize)
    return bar


def heat(ax: Axes, matrix: np.ndarray, cmap, norm, *, alpha: np.ndarray | None = None, origin: str = "upper"):
    image = ax.imshow(
        np.ma.masked_invalid(np.asarray(matrix, dtype=float)),
        cmap=cmap,
        norm=norm,
        aspect="auto",
        interpolation="nearest",
        origin=origin,
        alpha=alpha,
    )
    ax.grid(False)
    return image


def cell_size(rows: int, cols: int, *, largest: float = 0.5, smallest: float = 0.16, budget: float = 10.0) -> float:
    """Inches a heat map cell gets: large for small maps, down to ``smallest``."""
    return float(min(largest, max(smallest, budget / max(rows, cols, 1))))


def annotate_cells(ax: Axes, matrix: np.ndarray, fmt: str, norm, cmap, fontsize: float = 7.0) -> None:
    """Write each cell's value, in black or white by the cell's brightness."""
    for (i, j), value in np.ndenumerate(matrix):
        if not np.isfinite(value):
            continue
        r, g, b, _ = cmap(norm(value))
        ax.text(
            j,
            i,
            format(value, fmt),
            ha="center",
            va="center",
            fontsize=fontsize,
            color="white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black",
        )
