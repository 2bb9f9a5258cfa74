"""The page of a figure (title, subtitle, legend strip, panels, caption) and its panels:
new figures, grids, shared ranges, ticks thinned to fit, outer labels."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.ticker import FixedLocator

TITLE_SIZE, SUBTITLE_SIZE, CAPTION_SIZE = 12.5, 9.5, 8.5
_PAD = 0.08  # inches around the page's texts
PAGE = "sinkscope-page"  # the gid of a figure laid out by finish()


def new_figure(width: float, height: float) -> Figure:
    """A figure with constrained layout and an Agg canvas (no pyplot state)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


# -- text measurement and the page ---------------------------------------------------------------


def _text_size(fig: Figure, text: str, size: float, weight: str = "normal") -> tuple[float, float]:
    """Width and height of ``text`` (lines at matplotlib's 1.2 line spacing) in inches."""
    renderer = fig.canvas.get_renderer()
    prop = FontProperties(family=matplotlib.rcParams["font.family"], size=size, weight=weight)
    lines = text.split("\n")
    width = max(renderer.get_text_width_height_descent(line, prop, ismath=False)[0] for line in lines)
    return width / fig.dpi, len(lines) * size * 1.2 / 72


def wrap(fig: Figure, text: str, width: float, size: float, weight: str = "normal") -> str:
    """``text`` wrapped so that every line is at most ``width`` inches wide; a subtitle's
    ' · ' parts stay whole where they fit."""

    def fits(line: str) -> bool:
        return _text_size(fig, line, size, weight)[0] <= width

    def by_words(paragraph: str) -> list[str]:
        measured = _text_size(fig, paragraph, size, weight)[0]
        chars = max(8, int(len(paragraph) * width / measured))
        while chars > 8:
            candidate = textwrap.wrap(paragraph, chars, break_on_hyphens=False)
            if all(fits(line) for line in candidate):
                return candidate
            chars -= 2
        return textwrap.wrap(paragraph, chars, break_on_hyphens=False)

    lines: list[str] = []
    for paragraph in text.split("\n"):
        if fits(paragraph) or len(paragraph) < 8:
            lines.append(paragraph)
            continue
        current = ""
        for part in paragraph.split(" · "):
            joined = f"{current} · {part}" if current else part
            if fits(joined):
                current = joined
                continue
            if current:
                lines.append(current)
            if fits(part):
                current = part
            else:
                *full, current = by_words(part)
                lines.extend(full)
        if current:
            lines.append(current)
    return "\n".join(lines)


def _legend_columns(fig: Figure, handles: Sequence[Any], width: float) -> int:
    widest = max(_text_size(fig, h.get_label(), matplotlib.rcParams["legend.fontsize"])[0] for h in handles) + 0.55
    return max(1, min(len(handles), int(width // widest)))


def finish(
    fig: Figure,
    *,
    title: str,
    subtitle: str | None = None,
    caption: str | None = None,
    legend: Sequence[Any] | None = None,
) -> Figure:
    """Lay out the page: title, subtitle, legend strip, panels, caption; then thin tick
    labels that would overlap. The figure grows by what the texts need."""
    width, body = fig.get_size_inches()
    room = width - 2 * _PAD
    blocks = []  # (kind, text or legend, height)
    texts = [("title", title, TITLE_SIZE, "bold"), ("subtitle", subtitle, SUBTITLE_SIZE, "normal")]
    for kind, text, size, weight in texts:
        if text:
            wrapped = wrap(fig, text, room, size, weight)
            artist = fig.text(0.5, 1, wrapped, ha="center", va="top", fontsize=size, fontweight=weight, color="0.1")
            artist.set_gid(f"page-{kind}")
            blocks.append((artist, _text_size(fig, wrapped, size, weight)[1] + 0.04))
    if legend:
        ncol = _legend_columns(fig, legend, room)
        ncol = math.ceil(len(legend) / math.ceil(len(legend) / ncol))  # balanced rows
        artist = fig.legend(
            handles=list(legend),
            loc="upper center",
            ncols=ncol,
            frameon=False,
            bbox_to_anchor=(0.5, 1),
            bbox_transform=fig.transFigure,
            borderaxespad=0.1,
            handlelength=1.6,
            columnspacing=1.2,
        )
        artist.set_gid("page-legend")
        height = artist.get_window_extent(fig.canvas.get_renderer()).height / fig.dpi
        blocks.append((artist, height + 0.02))
    foot = None
    if caption:
        wrapped = wrap(fig, caption, room, CAPTION_SIZE)
        foot = fig.text(0.5, 0, wrapped, ha="center", va="bottom", fontsize=CAPTION_SIZE, color="0.25")
        foot.set_gid("page-caption")
        foot_height = _text_size(fig, wrapped, CAPTION_SIZE)[1] + 0.06
    else:
        foot_height = 0.0
    head_height = _PAD + sum(h for _, h in blocks) + (0.06 if blocks else 0)
    total = body + head_height + foot_height + (_PAD if caption else 0)
    fig.set_size_inches(width, total)
    y = total - _PAD
    for artist, height in blocks:
        if hasattr(artist, "set_bbox_to_anchor"):
            artist.set_bbox_to_anchor((0.5, y / total), transform=fig.transFigure)
        else:
            artist.set_y(y / total)
        y -= height
    if foot is not None:
        foot.set_y(_PAD / total)
    bottom = (foot_height + (_PAD if caption else 0)) / total
    # Constrained layout's rect is (left, bottom, width, height).
    fig.get_layout_engine().set(rect=(0, bottom, 1, (total - head_height) / total - bottom))
    settle(fig)
    if declutter(fig):
        settle(fig)
    freeze(fig)
    fig.set_gid(PAGE)
    return fig


def _positions(fig: Figure) -> np.ndarray:
    return np.array([ax.get_position(original=True).bounds for ax in fig.axes]).reshape(-1, 4)


def settle(fig: Figure, passes: int = 6, tolerance: float = 1e-4) -> int:
    """Run constrained layout until the panels stop moving (each pass measures texts at the
    positions of the previous one; the moves shrink fourfold a pass). Returns the passes."""
    engine = fig.get_layout_engine()
    before = _positions(fig)
    for count in range(1, passes + 1):
        engine.execute(fig)
        after = _positions(fig)
        if after.shape == before.shape and (after.size == 0 or np.abs(after - before).max() < tolerance):
            return count
        before = after
    return passes


def freeze(fig: Figure) -> None:
    """Keep the settled layout: later draws (saving, a notebook's display) do not move the
    panels again, so the files are the same however often the figure was drawn.
    ``fig.set_layout_engine("constrained")`` lays it out afresh (after a resize, say)."""
    fig.set_layout_engine("none")


def declutter(fig: Figure) -> bool:
    """Thin the fixed tick labels that would overlap at the figure's final size: every
    axis at once, then one more look (a few rounds at most). Whether any changed."""
    changed_any = False
    for _ in range(4):
        # The layout passes placed every tick label (Axes.get_tightbbox): measure them there.
        renderer = fig.canvas.get_renderer()
        changed = False
        seen = set()
        for ax in fig.axes:
            if not ax.get_visible():
                continue
            for axis in (ax.xaxis, ax.yaxis):
                locator = axis.get_major_locator()
                if not isinstance(locator, FixedLocator) or id(locator) in seen or not _overlapping(axis, renderer):
                    continue
                seen.add(id(locator))  # shared axes share their locator
                ticks = list(axis.get_majorticklocs())
                labels = [t.get_text() for t in axis.get_majorticklabels()][: len(ticks)]
                if len(ticks) < 2:
                    continue
                keep = list(range(0, len(ticks), 2))
                axis.set_ticks([ticks[i] for i in keep], labels=[labels[i] for i in keep])
                changed = True
        changed_any |= changed
        if not changed:
            return changed_any
        fig.get_layout_engine().execute(fig)
    return changed_any


def _overlapping(axis, renderer) -> bool:
    lo, hi = sorted(axis.get_view_interval())
    ticks = axis.get_major_ticks()[: len(axis.get_majorticklocs())]
    labels = [t.label1 for t in ticks if lo - 1e-9 <= t.get_loc() <= hi + 1e-9]
    boxes = [t.get_window_extent(renderer) for t in labels if t.get_visible() and t.get_text()]
    horizontal = axis.axis_name == "x"
    boxes.sort(key=lambda b: b.x0 if horizontal else b.y0)
    for a, b in zip(boxes, boxes[1:]):
        if (b.x0 < a.x1 + 2) if horizontal else (b.y0 < a.y1 + 1):
            if (a.y0 < b.y1 and b.y0 < a.y1) if horizontal else (a.x0 < b.x1 and b.x0 < a.x1):
                return True
    return False


# -- panels --------------------------------------------------------------------------------------


def panel_columns(count: int, widest: int = 4) -> int:
    """Columns of a grid of ``count`` panels: rows of up to ``widest``, more for many panels."""
    if count <= widest:
        return max(1, count)
    if count <= 16:
        return min(widest, 4)
    return 6 if count <= 36 else 8


def panel_grid(
    count: int, *, ncols: int, panel: tuple[float, float], extra: tuple[float, float] = (0.0, 0.0)
) -> tuple[Figure, list[Axes]]:
    """A figure of ``count`` panels in rows of ``ncols``; unused cells removed."""
    nrows = math.ceil(count / ncols)
    fig = new_figure(ncols * panel[0] + extra[0], nrows * panel[1] + extra[1])
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[count:]:
        ax.remove()
    return fig, axes[:count]


def panels(
    ax: Axes | None,
    count: int,
    *,
    kind: str,
    one: str,
    ncols: int,
    panel: tuple[float, float],
    extra: tuple[float, float] = (0.0, 0.0),
) -> tuple[Figure, list[Axes]]:
    """The caller's axes (plot API: ``ax=``, one panel only), else a new grid of ``count``
    panels; ``one`` says how to ask for a single panel, e.g. "head (heads=['L1H1'])"."""
    if ax is not None:
        if count != 1:
            raise ValueError(f"{kind} draws into one axes only for one {one}")
        return ax.figure, [ax]
    return panel_grid(count, ncols=ncols, panel=panel, extra=extra)


def share_y(axes: Sequence[Axes], labels: str = "first") -> None:
    """One y range for panels that compare (set, not matplotlib's sharing: that costs
    O(panels²) per draw); y tick labels on the first column only (``labels='first'``)."""
    shown = [ax for ax in axes if ax.has_data()]
    if not shown:
        return
    lo = min(ax.get_ylim()[0] for ax in shown)
    hi = max(ax.get_ylim()[1] for ax in shown)
    for ax in shown:
        ax.set_ylim(lo, hi)
        spec = ax.get_subplotspec()
        if labels == "first" and spec is not None:
            ax.tick_params(labelleft=spec.is_first_col())


def message_panel(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.35", fontsize=9, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)


def outer_labels(axes: Sequence[Axes], xlabel: str | None, ylabel: str | None) -> None:
    """Axis labels on the grid's outer panels only (bottom row: x; first column: y).

    Figure-level labels (supxlabel) would sit outside the layout's rect, on the caption."""
    for ax in axes:
        spec = ax.get_subplotspec()
        if spec is None:
            continue
        below = ax.figure.axes and not any(
            other is not ax
            and other.get_subplotspec() is not None
            and other.get_subplotspec().colspan.start == spec.colspan.start
            and other.get_subplotspec().rowspan.start > spec.rowspan.start
            for other in ax.figure.axes
        )
        if xlabel and below:
            ax.set_xlabel(xlabel)
        if ylabel and spec.is_first_col():
            ax.set_ylabel(ylabel)


# A query's attention is unchanged when all its logits shift together: a logit curve's
# level says nothing, and in a trained model the levels of heads or layers differ by
# hundreds. Panels of logit curves therefore take their own y ranges; masses share one.
LOGIT_LEVEL_NOTE = (
    "A query's attention is unchanged when all its logits shift together, so only the differences "
    "within a curve matter."
)


def panel_y_scales(axes: Sequence[Axes], metric: str) -> bool:
    """One y range for softmax-mass panels (they compare), one per panel for logits (each
    labelled); tick labels on the outer panels otherwise. True when the range is shared."""
    shared = metric == "prob_mass"
    if shared:
        share_y(axes)
    outer_ticks(axes)
    for ax in [] if shared else axes:
        ax.tick_params(labelleft=True)
    return shared


def outer_ticks(axes: Sequence[Axes]) -> None:
    """Tick labels on the outer panels of a grid only (panels that share their axes' meaning)."""
    bottoms = {}
    for ax in axes:
        spec = ax.get_subplotspec()
        if spec is not None:
            col = spec.colspan.start
            bottoms[col] = max(bottoms.get(col, -1), spec.rowspan.start)
    for ax in axes:
        spec = ax.get_subplotspec()
        if spec is None:
            continue
        ax.tick_params(labelbottom=spec.rowspan.start == bottoms[spec.colspan.start], labelleft=spec.is_first_col())


# -- ticks ---------------------------------------------------------------------------------------


def tick_step(count: int, most: int) -> int:
    for step in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000):
        if math.ceil(count / step) <= most:
            return step
    return math.ceil(count / most)


def set_frame_ticks(
    ax: Axes, frames: Sequence[int], base: int = 0, *, axis: str = "x", offset: float = 0.0, length: float | None = None
) -> None:
    """Ticks at frames (labelled ``frame + base``), thinned to what ``length`` inches hold."""
    frames = [int(f) for f in frames]
    if not frames:
        return
    lo, hi = min(frames), max(frames)
    widest = len(str(hi + base))
    most = max(2, int((length or 6.0) / (0.12 + 0.075 * widest))) if axis == "x" else max(2, int((length or 4.0) / 0.2))
    step = tick_step(hi - lo + 1, most)
    # Small steps count from the first frame (1, 3, 5 ... in the paper's numbering); larger
    # ones sit on round numbers.
    ticks = list(range(lo, hi + 1, step)) if step <= 2 else [f for f in range(lo, hi + 1) if (f + base) % step == 0]
    if lo not in ticks and (not ticks or ticks[0] - lo >= step / 2):
        ticks.insert(0, lo)
    if step > 1 and hi not in ticks and hi - ticks[-1] >= step / 2:
        ticks.append(hi)
    setter = ax.set_xticks if axis == "x" else ax.set_yticks
    setter([f + offset for f in ticks], labels=[str(f + base) for f in ticks])


def set_label_ticks(ax: Axes, labels: Sequence[str], *, axis: str = "x", length: float | None = None) -> None:
    """Categorical ticks (L1, H3, ...) at 0..n-1, thinned to what ``length`` inches hold:
    every other one, or the first and then round numbers (L1, L5, L10, ...)."""
    n = len(labels)
    widest = max((len(s) for s in labels), default=1)
    most = max(2, int((length or 6.0) / (0.1 + 0.07 * widest))) if axis == "x" else max(2, int((length or 4.0) / 0.17))
    step = tick_step(n, most) if n > most else 1
    if step <= 2:  # L1, L3, L5, ...
        keep = list(range(0, n, step))
    else:  # L1, L5, L10, ...
        keep = [0] if n else []
        for i in range(1, n):
            if (i + 1) % step == 0 and i - keep[-1] >= 0.6 * step:
                keep.append(i)
    setter = ax.set_xticks if axis == "x" else ax.set_yticks
    setter(keep, labels=[labels[i] for i in keep])
