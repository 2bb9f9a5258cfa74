"""What every figure shares: style, saving, the page layout, frame labels and ticks, the
marking of the query block's own frames, colour scales, panel grids and the data views.

The page of a figure, top to bottom: a bold title, a subtitle (source · call · metric ·
runs averaged), a legend strip, the panels, a caption. Title, subtitle and caption are
wrapped to the figure's width by measuring them, and the panels are laid out by
matplotlib's constrained layout inside what is left, so nothing overlaps at any size.

Every number a figure prints comes from ``sinkscope.stats.summaries``; the views here only
select and reindex what it returns (every key frame 0..F-1 becomes a column, NaN where
a frame is not visible, so bars are missing and lines break there).

Figures are ``matplotlib.figure.Figure`` objects with an Agg canvas, never pyplot
figures: the pipeline keeps no global state and a notebook's backend is left alone.
"""

from __future__ import annotations

import contextlib
import math
import textwrap
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.style
import numpy as np
import pandas as pd
from matplotlib import colors as mcolors
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.layout_engine import PlaceHolderLayoutEngine
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FixedLocator

from sinkscope.io import atomic_path
from sinkscope.naming import head_label, layer_label, parse_head_label  # noqa: F401 - the kind modules use c.layer_label
from sinkscope.schema import schema_defaults
from sinkscope.stats.summaries import (
    block_calls,
    curve_stats,
    figure4_curves,
    head_diagnostics,
    last_block,
    resolve_step,
    runs_in,
)

STYLE = {
    "svg.fonttype": "none",  # SVG text stays text: editable in Illustrator / Inkscape
    "svg.hashsalt": "sinkscope",  # stable element ids between runs
    "font.family": "sans-serif",
    "font.sans-serif": ["Arial", "DejaVu Sans", "Helvetica"],
    "font.size": 10,
    "axes.labelsize": 10,
    "axes.titlesize": 10.5,
    "xtick.labelsize": 8.5,
    "ytick.labelsize": 8.5,
    "legend.fontsize": 9,
    "figure.dpi": 100,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.1,
    "axes.grid": True,
    "grid.alpha": 0.35,
    "grid.linestyle": "--",
    "image.interpolation": "nearest",
}
# What a kind draws with when its options leave a key out: the config schema's
# figures defaults (one definition, sinkscope.schema).
DEFAULTS: dict[str, Any] = schema_defaults("figures")
METRIC_LABELS = {
    "logit_mean": "attention logit (mean q·k/√d)",
    "prob_mass": "attention mass (softmax, per frame)",
}
METRIC_SHORT = {"logit_mean": "logits (pre-softmax q·k/√d)", "prob_mass": "softmax mass"}
PANEL_COLORS = ["#2E86AB", "#A23B72", "#F18F01", "#C73E1D", "#3B1F2B", "#6A994E"]
OWN_COLOR = "#F7DFA3"  # the query block's own frames (behind the data, visible in SVG and PNG)
OWN_EDGE = "#8A5A00"
GAP_COLOR = "#E4E4E4"  # key frames not in the KV cache
NAN_COLOR = "#BDBDBD"  # heat map cells without a value (not in the cache)
CLASS_COLORS = {"sink": "#C73E1D", "local": "#2E86AB", "periodic": "#F18F01", "diffuse": "#CFCFCF"}
TITLE_SIZE, SUBTITLE_SIZE, CAPTION_SIZE = 12.5, 9.5, 8.5
VAE_TEMPORAL_STRIDE = 4
_PAD = 0.08  # inches around the page's texts
PAGE = "sinkscope-page"  # the gid of a figure laid out by finish()


# -- style and saving --------------------------------------------------------------------------


@contextlib.contextmanager
def figure_style() -> Iterator[None]:
    # A style matplotlib ships (seaborn's look without the seaborn package, which the
    # figures do not otherwise need).
    with matplotlib.style.context("seaborn-v0_8-whitegrid"), matplotlib.rc_context(STYLE):
        yield


def new_figure(width: float, height: float) -> Figure:
    """A figure with constrained layout and an Agg canvas (no pyplot state)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, svg: str | Path, png: str | Path, dpi: int = 200) -> None:
    """Write SVG and PNG atomically, without timestamps (byte-stable reruns).

    The style is applied again here: svg.fonttype is read at save time. A figure still
    under a layout engine (one drawn into a given axes, say) is settled first and saved
    with that layout held, the same in both files. Dense artists drawn with
    ``rasterized=True`` (token curves) are embedded in the SVG at ``dpi``.
    """
    engine = fig.get_layout_engine()
    with figure_style():
        if engine is not None and not isinstance(engine, PlaceHolderLayoutEngine):
            settle(fig)
            fig.set_layout_engine("none")
        # A page laid out by finish() fits its figure already: no second, "tight" layout pass.
        bbox = None if fig.get_gid() == PAGE else "tight"
        try:
            with atomic_path(svg) as tmp:
                fig.savefig(tmp, format="svg", dpi=dpi, metadata={"Date": None}, bbox_inches=bbox)
            with atomic_path(png) as tmp:
                fig.savefig(tmp, format="png", dpi=dpi, metadata={"Software": None}, bbox_inches=bbox)
        finally:
            if engine is not None:
                fig.set_layout_engine(engine)


def option(options: Mapping[str, Any], name: str) -> Any:
    value = options.get(name)
    return DEFAULTS[name] if value is None and name != "highlight_layers" else value


# -- words ---------------------------------------------------------------------------------------


def runs_of(values: Iterable[int]) -> list[tuple[int, int]]:
    """[0, 1, 2, 9, 10] -> [(0, 2), (9, 10)]: the runs of consecutive integers."""
    values = sorted({int(v) for v in values})
    if not values:
        return []
    runs, start, previous = [], values[0], values[0]
    for value in values[1:]:
        if value != previous + 1:
            runs.append((start, previous))
            start = value
        previous = value
    runs.append((start, previous))
    return runs


def frames_text(frames: Iterable[int], base: int = 0) -> str:
    """[18, 19, 20] -> '18-20'; [0, 1, 2, 9, 10] -> '0-2, 9-10' (shifted by ``base``)."""
    runs = runs_of(frames)
    if not runs:
        return "none"
    return ", ".join(f"{a + base}" if a == b else f"{a + base}-{b + base}" for a, b in runs)


def timestep_text(timestep: float) -> str:
    """A model timestep as the figures print it: 833.333 -> '833', 0.25 -> '0.25'."""
    return f"{timestep:.0f}" if abs(timestep) >= 10 else f"{timestep:.3g}"


def call_label(pass_: str, step: int, timestep: float | None = None) -> str:
    """'denoising step 3 (t=250)', 'cache pass (t=0)' or 'imported call'."""
    missing = timestep is None or (isinstance(timestep, float) and math.isnan(timestep))
    t = "" if missing else f" (t={timestep_text(float(timestep))})"
    if pass_ == "cache":
        return f"cache pass{t}"
    if step < 0:
        return "imported call"
    return f"denoising step {step}{t}"


def runs_text(runs: int, spread: str | None = None) -> str:
    """'mean of n = 2 runs, bars ±1 std between runs', or 'n = 1 run: no spread between
    runs' (``spread``: how the figure shows the spread between runs)."""
    if runs < 2:
        return f"n = {runs} run{'s' if runs != 1 else ''}: no spread between runs"
    return f"mean of n = {runs} runs" + (f", {spread}" if spread else "")


def subtitle(source: str, call: str, metric: str, runs: int, spread: str | None = None) -> str:
    return " · ".join([source, call, metric, runs_text(runs, spread)])


def metric_axis_label(metric: str) -> str:
    return METRIC_LABELS.get(metric, metric)


def heads_of(options: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """The option's heads as (paper label, 0-based layer, 0-based head)."""
    return [(label, *parse_head_label(label)) for label in option(options, "heads")]


# -- selecting one source ------------------------------------------------------------------------


def table(tables: Mapping[str, pd.DataFrame], name: str, kind: str) -> pd.DataFrame:
    frame = tables.get(name)
    if frame is None:
        raise ValueError(f"figure {kind} needs the {name} table")
    if len(frame) == 0:
        raise ValueError(f"figure {kind}: the {name} table has no rows")
    return frame


def sources_in(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """The (checkpoint, variant) pairs of the table."""
    if "checkpoint" not in frame.columns:
        return []
    if "variant" not in frame.columns:
        return [(str(name), "default") for name in pd.unique(frame["checkpoint"])]
    pairs = frame.groupby(["checkpoint", "variant"], observed=True, sort=True).size().index
    return [(str(a), str(b)) for a, b in pairs]


def one_source(frame: pd.DataFrame, kind: str) -> pd.DataFrame:
    """``frame`` if it holds one (checkpoint, variant); a clear error otherwise."""
    found = sources_in(frame)
    if len(found) > 1:
        names = ", ".join(f"{c}@{v}" if v != "default" else c for c, v in sorted(found))
        raise ValueError(f"figure {kind} draws one checkpoint and variant; the table holds {names} "
                         "(pick one: checkpoint=..., variant=...)")  # fmt: skip
    return frame


def one_checkpoint(table: pd.DataFrame, kind: str) -> None:
    """Refuse a table of several checkpoints for a figure that draws one (its variants)."""
    checkpoints = sorted(str(x) for x in pd.unique(table["checkpoint"]))
    if len(checkpoints) > 1:
        raise ValueError(f"figure {kind} draws one checkpoint; the table holds {', '.join(checkpoints)} (checkpoint=...)")


def variants_in(frame: pd.DataFrame) -> list[str]:
    """Variants in the table's order of appearance, 'default' first."""
    if "variant" not in frame.columns:
        return ["default"]
    found = [str(v) for v in pd.unique(frame["variant"])]
    return sorted(found, key=lambda v: (v != "default", found.index(v)))


# -- data views ----------------------------------------------------------------------------------


@dataclass
class View:
    """The Figure 4 view of one call (``summaries.figure4_curves``), every frame a column:
    the run-averaged curves, their uniform baselines and each run's curve."""

    curves: pd.DataFrame  # index (layer, head); columns 0..F-1; NaN = not visible
    query_frames: list[int]
    pass_: str
    step: int
    timestep: float
    runs: int
    metric: str
    uniform: pd.DataFrame | None = None  # as curves: summaries.uniform_mass averaged like the curves
    run_curves: pd.DataFrame | None = None  # index (prompt_id, seed, layer, head); columns as curves
    run_uniform: pd.DataFrame | None = None
    stats_cache: dict = field(default_factory=dict, repr=False)

    @property
    def call(self) -> str:
        return call_label(self.pass_, self.step, self.timestep)

    @property
    def frames(self) -> np.ndarray:
        return self.curves.columns.to_numpy()

    @property
    def visible(self) -> list[int]:
        return [int(f) for f in self.curves.columns[self.curves.notna().any(axis=0)]]

    def has(self, layer: int, head: int) -> bool:
        return (layer, head) in self.curves.index

    def curve(self, layer: int, head: int) -> pd.Series:
        return self.curves.loc[(layer, head)]

    def baseline(self, layer: int, head: int) -> pd.Series:
        """The uniform baseline of one head's curve (NaN where a frame is not visible)."""
        curve = self.curve(layer, head)
        if self.uniform is not None and (layer, head) in self.uniform.index:
            return self.uniform.loc[(layer, head)].where(curve.notna())
        return (curve.notna() / max(int(curve.notna().sum()), 1)).where(curve.notna())

    def stats(self, layer: int, head: int) -> dict[str, Any]:
        """``summaries.curve_stats`` of one head's curve (the head_stats row with prompt '*')."""
        key = (layer, head)
        if key not in self.stats_cache:
            values = self.curve(layer, head).to_numpy()
            self.stats_cache[key] = curve_stats(values, self.frames, self.query_frames, self.metric,
                                                uniform=self.baseline(layer, head).to_numpy())  # fmt: skip
        return self.stats_cache[key]

    def _runs_of(self, layer: int, head: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """(curve, baseline) of each run: one head's, or the layer's head-averaged one."""
        if self.run_curves is None or self.runs < 2:
            return []
        curves = self.run_curves.xs(layer, level="layer")
        uniform = self.run_uniform.xs(layer, level="layer") if self.run_uniform is not None else None
        if head is not None:
            if head not in curves.index.get_level_values("head"):
                return []
            curves = curves.xs(head, level="head")
            uniform = uniform.xs(head, level="head") if uniform is not None else None
        else:
            curves = curves.groupby(["prompt_id", "seed"], observed=True).mean()
            uniform = uniform.groupby(["prompt_id", "seed"], observed=True).mean() if uniform is not None else None
        baselines = uniform.reindex(curves.index).to_numpy() if uniform is not None else [None] * len(curves)
        return list(zip(curves.to_numpy(dtype=float), baselines))

    def run_std(self, layer: int, head: int | None, name: str) -> float:
        """Sample std (ddof 1) between runs of statistic ``name`` of each run's curve (one
        head's, or the layer's head-averaged one with ``head=None``): head_stats /
        layer_stats ``<name>_run_std``. NaN with one run."""
        key = ("run_std", layer, head, name)
        if key not in self.stats_cache:
            values = [curve_stats(curve, self.frames, self.query_frames, self.metric, uniform=base)[name]
                      for curve, base in self._runs_of(layer, head)]  # fmt: skip
            finite = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
            self.stats_cache[key] = float(finite.std(ddof=1)) if finite.size >= 2 else float("nan")
        return self.stats_cache[key]

    def std(self, layer: int, head: int | None = None) -> pd.Series | None:
        """Per key frame, the sample std between runs of one head's curve (or of the layer's
        head-averaged curve); None with one run."""
        runs = self._runs_of(layer, head)
        if len(runs) < 2:
            return None
        return pd.Series(column_std(np.stack([curve for curve, _ in runs])), index=self.curves.columns)

    def layer_mean(self, layer: int) -> pd.Series:
        """The head-averaged curve of a layer (what layer_stats summarizes)."""
        return self.curves.loc[layer].mean(axis=0)

    def layer_baseline(self, layer: int) -> pd.Series:
        mean = self.layer_mean(layer)
        if self.uniform is not None:
            return self.uniform.loc[layer].mean(axis=0).where(mean.notna())
        return (mean.notna() / max(int(mean.notna().sum()), 1)).where(mean.notna())

    def layer_stats(self, layer: int) -> dict[str, Any]:
        return curve_stats(self.layer_mean(layer).to_numpy(), self.frames, self.query_frames, self.metric,
                           uniform=self.layer_baseline(layer).to_numpy())  # fmt: skip

    @property
    def layers(self) -> list[int]:
        return sorted({int(x) for x in self.curves.index.get_level_values("layer")})

    def heads(self, layer: int) -> list[int]:
        return sorted(int(h) for h in self.curves.loc[layer].index)


def layers_of(frame: pd.DataFrame, heads: Sequence[tuple[str, int, int]]) -> pd.DataFrame:
    """The rows of the layers the heads live in (or every row, when none of them is there:
    the panels then say that the layer was not extracted)."""
    rows = frame[frame["layer"].isin({layer for _, layer, _ in heads})]
    return rows if len(rows) else frame


def figure4_view(frame: pd.DataFrame, step: str | int, metric: str) -> View:
    """The last block's query-averaged curves of the chosen call, runs averaged, with their
    uniform baselines and each run's curve."""
    curves, info = figure4_curves(frame, step, metric, details=True)
    last = max([int(c) for c in curves.columns] + list(info["query_frames"]))
    columns = pd.RangeIndex(0, last + 1, name="key_frame")
    curves = curves.reindex(columns=columns)
    curves.columns.name = "key_frame"
    extra = {name: info[name].reindex(columns=columns) for name in ("uniform", "run_curves", "run_uniform")}
    return View(curves, list(info["query_frames"]), info["pass"], int(info["step"]), info["timestep"], info["runs"], metric,
                **extra)  # fmt: skip


def mass_view(frame: pd.DataFrame, view: View) -> View:
    """The softmax-mass view of ``view``'s call (``view`` itself when it shows mass): the
    frame-0 excess over uniform is a statistic of the mass curve."""
    if view.metric == "prob_mass":
        return view
    step = "cache" if view.pass_ == "cache" else view.step
    return figure4_view(frame, step, "prob_mass")


# -- head classes and what a head's title says ----------------------------------------------------


def head_classes(diagnostics: pd.DataFrame | None, frame: pd.DataFrame, view: View) -> tuple[dict[tuple[int, int], str], str]:
    """Each head's ``head_class`` at the view's call, and where it comes from: the
    head_diagnostics table, or (without one) ``summaries.head_diagnostics`` of the frame
    rows at the schema's default thresholds."""
    source = "head_diagnostics"
    if diagnostics is None or diagnostics.empty:
        rows = last_block(frame)
        rows = rows[(rows["pass"] == view.pass_) & (rows["step"] == view.step)]
        diagnostics = head_diagnostics(rows) if len(rows) else None
        source = "head_diagnostics of these rows at the default thresholds"
    if diagnostics is None:
        return {}, source
    chosen = diagnostics[(diagnostics["pass"] == view.pass_) & (diagnostics["step"] == view.step)]
    classes = {(int(a), int(b)): str(k) for a, b, k in zip(chosen["layer"], chosen["head"], chosen["head_class"])}
    return classes, source


def class_text(klass: str | None) -> str:
    """'sink head', 'periodic head', ...: a head is called sink only when its class is."""
    return f"{klass} head" if klass else "class n/a"


def excess_text(view: View, layer: int, head: int, *, short: bool = False, spread: bool = False) -> str:
    """'frame-0 excess +0.312' (over uniform; ``view`` shows softmax mass), ± the std
    between runs with ``spread``."""
    value = view.stats(layer, head)["frame0_excess"]
    if not np.isfinite(value):
        return "frame 0 not visible"
    text = f"{'excess' if short else 'frame-0 excess'} {number(value, 'prob_mass', signed=True)}"
    std = view.run_std(layer, head, "frame0_excess") if spread else float("nan")
    return text + (f" ± {number(std, 'prob_mass')}" if np.isfinite(std) else "")


def difference_text(view: View, layer: int, head: int) -> str:
    """'first − middle +0.29': head_stats' sink_score, in the view's metric."""
    return f"first − middle {number(view.stats(layer, head)['sink_score'], view.metric, signed=True)}"


def column_std(matrix: np.ndarray) -> np.ndarray:
    """Sample std (ddof 1) of each column over its finite values; NaN below two."""
    matrix = np.asarray(matrix, dtype=float)
    finite = np.isfinite(matrix)
    count = finite.sum(axis=0)
    filled = np.where(finite, matrix, 0.0)
    mean = filled.sum(axis=0) / np.maximum(count, 1)
    squares = np.where(finite, (matrix - mean) ** 2, 0.0).sum(axis=0)
    return np.where(count >= 2, np.sqrt(squares / np.maximum(count - 1, 1)), np.nan)


def spread_note(stds: Iterable[float], runs: int, what: str = "a cell") -> str:
    """'between-run std of a cell: median 0.012, max 0.051 (n = 2 runs)'."""
    values = np.asarray([v for v in stds if v is not None and np.isfinite(v)], dtype=float)
    if runs < 2 or not values.size:
        return f"n = {runs} run{'s' if runs != 1 else ''}: no spread between runs"
    return (f"between-run std of {what}: median {significant(float(np.median(values)))}, "
            f"max {significant(float(values.max()))} (n = {runs} runs)")  # fmt: skip


def significant(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, without exponents for ordinary sizes."""
    if value is None or not np.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    if abs(value) >= 10 ** digits:
        return f"{value:.0f}"
    value = float(f"{value:.{digits}g}")  # 0.09996 -> 0.1, then printed as 0.100
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(value)))))
    return f"{value:.{decimals}f}"


def last_block_calls(frame: pd.DataFrame) -> list[str | int]:
    """The calls of the last block as ``step`` options: denoising steps, then 'cache'."""
    rows = frame[frame["block"] == frame["block"].max()]
    steps = sorted(int(s) for s in set(rows.loc[rows["pass"] == "denoise", "step"]))
    calls: list[str | int] = [s for s in steps if s >= 0]
    if (rows["pass"] == "cache").any():
        calls.append("cache")
    if not calls:  # imported rows: one call, step -1
        calls = ["last"]
    return calls


def block_frames(frame: pd.DataFrame) -> dict[int, list[int]]:
    """Block -> its query frames, from the rows."""
    pairs = frame[["block", "query_frame"]].drop_duplicates()
    return {int(b): sorted(int(f) for f in g["query_frame"]) for b, g in pairs.groupby("block")}


def evenly(items: Sequence[Any], count: int) -> list[Any]:
    """Up to ``count`` items spread evenly, first and last included."""
    if len(items) <= count:
        return list(items)
    index = np.unique(np.round(np.linspace(0, len(items) - 1, count)).astype(int))
    return [items[i] for i in index]


def run_count(frame: pd.DataFrame) -> int:
    return runs_in(frame) if {"prompt_id", "seed"} <= set(frame.columns) else 1


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
        artist = fig.legend(handles=list(legend), loc="upper center", ncols=ncol, frameon=False,
                            bbox_to_anchor=(0.5, 1), bbox_transform=fig.transFigure, borderaxespad=0.1,
                            handlelength=1.6, columnspacing=1.2)  # fmt: skip
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


def panel_grid(count: int, *, ncols: int, panel: tuple[float, float], extra: tuple[float, float] = (0.0, 0.0)
               ) -> tuple[Figure, list[Axes]]:  # fmt: skip
    """A figure of ``count`` panels in rows of ``ncols``; unused cells removed."""
    nrows = math.ceil(count / ncols)
    fig = new_figure(ncols * panel[0] + extra[0], nrows * panel[1] + extra[1])
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[count:]:
        ax.remove()
    return fig, axes[:count]


def panels(ax: Axes | None, count: int, *, kind: str, one: str, ncols: int, panel: tuple[float, float],
           extra: tuple[float, float] = (0.0, 0.0)) -> tuple[Figure, list[Axes]]:  # fmt: skip
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


def tick_step(count: int, most: int) -> int:
    for step in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000):
        if math.ceil(count / step) <= most:
            return step
    return math.ceil(count / most)


def set_frame_ticks(ax: Axes, frames: Sequence[int], base: int = 0, *, axis: str = "x", offset: float = 0.0,
                    length: float | None = None) -> None:  # fmt: skip
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


def mark_own(ax: Axes, query_frames: Sequence[int], *, left: float = -0.5, width: float = 1.0,
             gid: str = "own-block") -> None:  # fmt: skip
    """A light span behind the query block's own frames (frame f covers f+left .. f+left+width)."""
    if not query_frames:
        return
    span = ax.axvspan(min(query_frames) + left, max(query_frames) + left + width, color=OWN_COLOR, zorder=0.5, lw=0)
    span.set_gid(gid)


def mark_gaps(ax: Axes, frames: Sequence[int], missing: Iterable[int], *, left: float = -0.5, width: float = 1.0,
              gid: str = "gap") -> bool:  # fmt: skip
    """Light grey spans over runs of key frames not in the KV cache; whether there were any."""
    runs = runs_of(missing)
    if not runs:
        return False
    for i, (a, b) in enumerate(runs):
        ax.axvspan(a + left, b + left + width, color=GAP_COLOR, zorder=0.4, lw=0).set_gid(f"{gid}-{i}")
    return True


def outline_frames(ax: Axes, frames: Sequence[int], rows: tuple[float, float], *, gid: str = "own-block",
                   color: str = "black") -> None:  # fmt: skip
    """A dashed box around columns ``frames`` of a heat map, rows ``rows`` (data coordinates)."""
    if not frames:
        return
    box = Rectangle((min(frames) - 0.5, rows[0]), max(frames) - min(frames) + 1, rows[1] - rows[0], fill=False,
                    edgecolor=color, lw=1.4, ls=(0, (3, 2)), zorder=4, clip_on=False)  # fmt: skip
    box.set_gid(gid)
    ax.add_patch(box)


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


def darker(color: str, amount: float = 0.35) -> tuple[float, float, float]:
    rgb = np.array(mcolors.to_rgb(color))
    return tuple(rgb * (1 - amount))


UNIFORM_COLOR = "0.15"
UNIFORM_STYLE = dict(color=UNIFORM_COLOR, lw=1.1, ls=(0, (4, 2)), zorder=4)
SPREAD_COLOR = "0.1"


def uniform_label(what: str = "1 / visible key frames") -> str:
    return f"uniform over the key tokens seen ({what})"


def uniform_handle(label: str | None = None) -> Line2D:
    return Line2D([], [], **{**UNIFORM_STYLE, "zorder": None}, label=label or uniform_label())


def spread_handle(label: str = "±1 std between runs") -> Line2D:
    return Line2D([], [], color=SPREAD_COLOR, ls="none", marker="|", ms=9, mew=1.0, label=label)


def band_handle(color, label: str = "±1 std between runs") -> Patch:
    return Patch(facecolor=color, alpha=0.25, edgecolor="none", label=label)


def uniform_steps(ax: Axes, frames: Sequence[int], baseline: Sequence[float], *, gid: str, left: float = -0.5,
                  width: float = 1.0) -> None:  # fmt: skip
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


def error_bars(ax: Axes, x: Sequence[float], y: Sequence[float], std: Sequence[float] | None, *, gid: str,
               color=SPREAD_COLOR) -> bool:  # fmt: skip
    """±1 std between runs as error bars (nothing without a spread); whether any were drawn."""
    if std is None:
        return False
    x, y, std = (np.asarray(v, dtype=float) for v in (x, y, std))
    keep = np.isfinite(y) & np.isfinite(std)
    if not keep.any():
        return False
    bars_ = ax.errorbar(x[keep], y[keep], yerr=std[keep], fmt="none", ecolor=color, elinewidth=0.9, capsize=1.8,
                        zorder=3.5)  # fmt: skip
    for child in bars_.get_children():
        child.set_gid(f"spread-{gid}")
    return True


def curve_panel(ax: Axes, curve: pd.Series, query_frames: Sequence[int], *, color: str, base: int, gid: str,
                length: float | None = None, markersize: float = 3.0, std: pd.Series | None = None,
                uniform: pd.Series | None = None) -> bool:  # fmt: skip
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


def bars(ax: Axes, x: Sequence[float], heights: Sequence[float], *, color, width: float = 0.8, alpha: float = 0.75,
         zorder: float = 2) -> PolyCollection:  # fmt: skip
    """Bars from 0, as one collection: one artist to draw (a grid of 40 panels of 21 bars
    draws several times faster than with Axes.bar) and one group in the SVG."""
    x, heights = np.asarray(x, dtype=float), np.asarray(heights, dtype=float)
    half = width / 2
    verts = np.stack([np.stack([x - half, np.zeros_like(x)], 1), np.stack([x - half, heights], 1),
                      np.stack([x + half, heights], 1), np.stack([x + half, np.zeros_like(x)], 1)], axis=1)  # fmt: skip
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
    ax.annotate(f"max@{frame + base}", xy=(frame, value), xytext=({"left": -4, "right": 4}.get(ha, 0), 3),
                textcoords="offset points", ha=ha,
                va="bottom" if value >= 0 else "top", fontsize=fontsize, color="darkgreen", fontweight="bold",
                zorder=5, annotation_clip=False)  # fmt: skip


def headroom(ax: Axes, fraction: float = 0.14) -> None:
    """Room above (and below) the data for max@ labels."""
    lo, hi = ax.get_ylim()
    span = hi - lo or 1.0
    ax.set_ylim(lo - (fraction * span if lo < 0 else 0), hi + fraction * span)


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
    lo, hi = (np.percentile(finite, CLIP_PERCENTILES) if finite.size >= CLIP_FROM else (finite.min(), finite.max()))
    if signed:
        vmax = float(max(abs(lo), abs(hi))) or 1.0
        return -vmax, vmax
    return 0.0, float(hi) if hi > 0 else 1.0


def colour_scale(values: np.ndarray | Iterable[float], metric: str) -> tuple[mcolors.Colormap, mcolors.Normalize]:
    """Signed metrics (logits): diverging, centred on 0; masses: sequential from 0; both
    clipped to percentiles (``colour_range``, stated by ``colourbar``); entropies: 0..1."""
    if metric in ("logit_mean", "sink_score", "signed"):
        return matplotlib.colormaps["RdBu_r"].with_extremes(bad=NAN_COLOR), mcolors.Normalize(*colour_range(values, True))
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


def colourbar(fig: Figure, image, values: np.ndarray | Iterable[float], label: str, *, fontsize: float | None = None,
              **kwargs: Any):  # fmt: skip
    """A colour bar labelled with ``label`` and, when the scale clips, the clipped range
    (arrows at the clipped ends)."""
    values = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
    finite = values[np.isfinite(values)]
    norm = image.norm
    below, above = bool((finite < norm.vmin).any()), bool((finite > norm.vmax).any())
    extend = "both" if below and above else "min" if below else "max" if above else "neither"
    bar = fig.colorbar(image, extend=extend, **kwargs)
    note = clip_note(values, norm)
    bar.set_label(label + (f"\n{note}" if note else ""), fontsize=fontsize)
    return bar


def heat(ax: Axes, matrix: np.ndarray, cmap, norm, *, alpha: np.ndarray | None = None, origin: str = "upper"):
    image = ax.imshow(np.ma.masked_invalid(np.asarray(matrix, dtype=float)), cmap=cmap, norm=norm, aspect="auto",
                      interpolation="nearest", origin=origin, alpha=alpha)  # fmt: skip
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
        ax.text(j, i, format(value, fmt), ha="center", va="center", fontsize=fontsize,
                color="white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black")  # fmt: skip


def class_cmap(classes: Sequence[str]) -> mcolors.ListedColormap:
    return mcolors.ListedColormap([CLASS_COLORS.get(c, "#888888") for c in classes]).with_extremes(bad="white")


def layer_colors(layers: Sequence[int]) -> dict[int, tuple]:
    cmap = matplotlib.colormaps["viridis"]
    positions = np.linspace(0.05, 0.9, max(len(layers), 1))
    return {layer: cmap(p) for layer, p in zip(layers, positions)}


def line_handle(color, label: str, **kwargs: Any) -> Line2D:
    return Line2D([], [], color=color, label=label, **{"lw": 1.8, **kwargs})


def step_of(frame: pd.DataFrame, step: str | int) -> tuple[str, int]:
    """``summaries.resolve_step`` of the rows."""
    return resolve_step(frame, step)


def head_text(layer: int, head: int) -> str:
    return f"{head_label(layer, head)} (layer {layer}, head {head})"


def latent_of_video_frame(video_frame: np.ndarray) -> np.ndarray:
    """Wan's causal VAE: video frame 0 -> latent 0, frames 4k-3..4k -> latent k."""
    return np.ceil(np.asarray(video_frame) / VAE_TEMPORAL_STRIDE).astype(int)


def uniform_share(view: View) -> float | None:
    """The uniform baseline of the view's frame-level curves when it is one number (no
    dropped tokens: 1 / visible key frames, the same for every head), else None."""
    if view.uniform is None:
        return None
    values = view.uniform.to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    if not values.size or not np.allclose(values, values[0], rtol=1e-6):
        return None
    return float(values[0])


def number(value: float, metric: str, signed: bool = False) -> str:
    """A statistic as the figures print it: 2 decimals for logits, 3 for masses."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    digits = 3 if metric == "prob_mass" else 2
    return f"{value:{'+' if signed else ''}.{digits}f}"


def outer_labels(axes: Sequence[Axes], xlabel: str | None, ylabel: str | None) -> None:
    """Axis labels on the grid's outer panels only (bottom row: x; first column: y).

    Figure-level labels (supxlabel) would sit outside the layout's rect, on the caption."""
    for ax in axes:
        spec = ax.get_subplotspec()
        if spec is None:
            continue
        below = ax.figure.axes and not any(
            other is not ax and other.get_subplotspec() is not None
            and other.get_subplotspec().colspan.start == spec.colspan.start
            and other.get_subplotspec().rowspan.start > spec.rowspan.start
            for other in ax.figure.axes
        )  # fmt: skip
        if xlabel and below:
            ax.set_xlabel(xlabel)
        if ylabel and spec.is_first_col():
            ax.set_ylabel(ylabel)


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


def block_call_rows(frame: pd.DataFrame, step: str | int) -> tuple[pd.DataFrame, str]:
    """The rows of the chosen call of every block (``summaries.block_calls``) and its
    label: 'denoising step 3 (t=625) of every block', or, where blocks differ in their
    steps, 'the last denoising step of every block'."""
    rows = block_calls(frame, step)
    if rows.empty:
        raise ValueError(f"no rows of step {step!r} in any block")
    calls = rows[["pass", "step"]].drop_duplicates()
    if len(calls) == 1:
        return rows, every_block_call(rows, str(calls["pass"].iloc[0]), int(calls["step"].iloc[0]))
    if step == "cache":
        return rows, "the cache pass of every block"
    return rows, "the last denoising step of every block (blocks differ in their steps)"


def every_block_call(rows: pd.DataFrame, pass_: str, step: int) -> str:
    """'denoising step 3 (t=250) of every block', 'cache pass (t=0) of every block'."""
    chosen = rows[(rows["pass"] == pass_) & (rows["step"] == step)]
    timestep = float(chosen["timestep"].iloc[0]) if len(chosen) and "timestep" in chosen else None
    return f"{call_label(pass_, step, timestep)} of every block" if step >= 0 or pass_ == "cache" else "the imported calls"
