"""Every figure of the seed notebooks, plus a layer x head sink-score overview.

Each figure is drawn from frame_attention rows and saved as SVG (text kept as text,
so labels stay editable) and PNG. Runs of the same source (prompts x seeds) are
averaged. Labels follow the paper: layer L and head H are 1-based in figure text
(L1H1 = layer 0, head 0); file names and tables stay 0-based.

Source figures (all layers of a checkpoint): ``figure4``, ``layer_comparison``,
``first_middle_last``, ``sink_score_overview``. Layer figures: ``per_head_grid``,
``heads_heatmap``, ``query_key_maps``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from .config import parse_head_label  # noqa: E402
from .io import atomic_path  # noqa: E402
from .tables import curve_stats, last_block, resolve_step  # noqa: E402

STYLE = {
    "svg.fonttype": "none",  # SVG text stays text: editable in Illustrator / Inkscape
    "svg.hashsalt": "sinkscope",  # stable element ids between runs
    "font.family": "sans-serif",
    "font.sans-serif": ["Arial", "DejaVu Sans", "Helvetica"],
    "font.size": 11,
    "axes.labelsize": 12,
    "axes.titlesize": 13,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "figure.dpi": 100,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.1,
}
PANEL_COLORS = ["#2E86AB", "#A23B72", "#F18F01", "#C73E1D", "#3B1F2B", "#6A994E"]
METRIC_LABELS = {
    "logit_mean": "Attention logit (mean q·k/√d)",
    "prob_mass": "Attention mass (softmax, per frame)",
}
METRIC_SHORT = {"logit_mean": "logits", "prob_mass": "softmax mass"}
VAE_TEMPORAL_STRIDE = 4


@contextlib.contextmanager
def figure_style() -> Iterator[None]:
    with plt.style.context("seaborn-v0_8-whitegrid"), matplotlib.rc_context(STYLE):
        yield


def save_figure(fig: plt.Figure, svg: str | Path, png: str | Path, dpi: int = 200) -> None:
    """Write SVG and PNG atomically, without timestamps (byte-stable reruns).

    The style is applied again here: svg.fonttype is read at save time.
    """
    with figure_style():
        with atomic_path(svg) as tmp:
            fig.savefig(tmp, format="svg", metadata={"Date": None})
        with atomic_path(png) as tmp:
            fig.savefig(tmp, format="png", dpi=dpi, metadata={"Software": None})
    plt.close(fig)


# -- data views --------------------------------------------------------------------------


def _runs(frame: pd.DataFrame) -> int:
    return int(frame.groupby(["prompt_id", "seed"], observed=True).ngroups)


def _step_label(pass_: str, step: int, frame: pd.DataFrame) -> str:
    rows = frame[(frame["pass"] == pass_) & (frame["step"] == step)]
    t = float(rows["timestep"].iloc[0]) if len(rows) else float("nan")
    if pass_ == "cache":
        return f"cache pass (t={t:g})"
    if step < 0:
        return "imported call"
    return f"denoising step {step} (t={t:.1f})" if not math.isnan(t) else f"denoising step {step}"


def last_block_curves(frame: pd.DataFrame, step: str | int, metric: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Query-averaged curves of the last block (the Figure 4 view), averaged over runs.

    Returns (curves, info): curves has index (layer, head) and one column per key
    frame; info holds the query frames, the chosen call and the number of runs.
    """
    rows = last_block(frame)
    pass_, step_index = resolve_step(rows, step)
    rows = rows[(rows["pass"] == pass_) & (rows["step"] == step_index)]
    if rows.empty:
        raise ValueError(f"no rows of the last block for pass={pass_!r}, step={step_index}")
    curves = rows.groupby(["layer", "head", "key_frame"], observed=True)[metric].mean().unstack("key_frame").sort_index(axis=1)
    info = {
        "query_frames": sorted(set(rows["query_frame"])),
        "call": _step_label(pass_, step_index, rows),
        "pass": pass_,
        "step": step_index,
        "runs": _runs(rows),
    }
    return curves, info


def full_matrices(frame: pd.DataFrame, step: str | int, metric: str) -> tuple[np.ndarray, list[int], dict[str, Any]]:
    """[heads, F, F] query x key matrices of one call kind across all blocks (NaN = not seen)."""
    pass_, step_index = resolve_step(frame, step)
    rows = frame[(frame["pass"] == pass_) & (frame["step"] == step_index)]
    if rows.empty:
        raise ValueError(f"no rows for pass={pass_!r}, step={step_index}")
    cells = rows.groupby(["head", "query_frame", "key_frame"], observed=True)[metric].mean()
    heads = sorted(set(rows["head"]))
    frames = sorted(set(rows["query_frame"]) | set(rows["key_frame"]))
    position = {f: i for i, f in enumerate(frames)}
    matrices = np.full((len(heads), len(frames), len(frames)), np.nan)
    head_pos = {h: i for i, h in enumerate(heads)}
    for (head, qf, kf), value in cells.items():
        matrices[head_pos[head], position[qf], position[kf]] = value
    return matrices, frames, {"call": _step_label(pass_, step_index, rows), "runs": _runs(rows), "heads": heads}


def latent_of_video_frame(video_frame: np.ndarray) -> np.ndarray:
    """Wan's causal VAE: video frame 0 -> latent 0, frames 4k-3..4k -> latent k."""
    return np.ceil(np.asarray(video_frame) / VAE_TEMPORAL_STRIDE).astype(int)


def _frames_text(frames: Sequence[int]) -> str:
    frames = list(frames)
    if frames and frames == list(range(frames[0], frames[-1] + 1)):
        return f"{frames[0]}-{frames[-1]}" if len(frames) > 1 else str(frames[0])
    return ",".join(map(str, frames))


def _subtitle(source: str, info: Mapping[str, Any], metric: str) -> str:
    runs = info["runs"]
    return f"{source} · {info['call']} · {METRIC_SHORT[metric]} · mean of {runs} run{'s' if runs != 1 else ''}"


def _key_ticks(ax: plt.Axes, frames: Sequence[int]) -> None:
    frames = list(frames)
    if len(frames) <= 25:
        ax.set_xticks(frames)
    else:
        step = math.ceil(len(frames) / 12)
        ax.set_xticks(frames[::step])


def _bar_curve(ax: plt.Axes, frames: Sequence[int], values: Sequence[float], color: str, query_frames: Sequence[int]) -> None:
    frames, values = np.asarray(frames), np.asarray(values, dtype=float)
    own = np.isin(frames, query_frames)
    ax.bar(frames[~own], values[~own], color=color, alpha=0.7, width=0.8, label="KV cache")
    ax.bar(frames[own], values[own], color=color, alpha=0.35, width=0.8, hatch="//", edgecolor=color, label="current block")
    ax.plot(frames, values, "o-", color=color, linewidth=1.5, markersize=4)
    ax.axhline(0, color="0.3", linewidth=0.6)


# -- source figures ------------------------------------------------------------------------


def draw_figure4(frame: pd.DataFrame, source: str, options: Mapping[str, Any]) -> plt.Figure:
    """Deep Forcing Figure 4: query-averaged attention of the last block, one panel per head."""
    metric = options["metric"]
    curves, info = last_block_curves(frame, options["step"], metric)
    panels = [(label, *parse_head_label(label)) for label in options["heads"]]
    ncols = min(2, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(7 * ncols, 4.2 * nrows), squeeze=False)
    for index, (label, layer, head) in enumerate(panels):
        ax = axes.flat[index]
        ax.set_title(f"{label} (layer {layer}, head {head})", fontweight="bold")
        if (layer, head) not in curves.index:
            ax.text(0.5, 0.5, f"layer {layer} was not extracted\n(add it to config 'layers')",
                    ha="center", va="center", transform=ax.transAxes, color="0.4")  # fmt: skip
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        values = curves.loc[(layer, head)].dropna()
        _bar_curve(ax, values.index, values.to_numpy(), PANEL_COLORS[index % len(PANEL_COLORS)], info["query_frames"])
        stats = curve_stats(values.to_numpy(), values.index.to_numpy())
        peak = stats["argmax_frame"]
        ax.annotate(f"max@{peak}", xy=(peak, values.loc[peak]), xytext=(4, 6), textcoords="offset points",
                    fontsize=9, color="darkgreen", fontweight="bold")  # fmt: skip
        ax.set_xlabel("Key Frame Index")
        ax.set_ylabel(METRIC_LABELS[metric])
        _key_ticks(ax, values.index)
        ax.margins(y=0.15)  # room for the max@ label above the tallest bar
        ax.legend(loc="best", fontsize=8, frameon=True)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    keys = sorted(curves.columns)
    fig.suptitle(
        f"Frame-wise attention of the last block (query frames {_frames_text(info['query_frames'])} → "
        f"key frames {_frames_text(keys)})\n{_subtitle(source, info, metric)}",
        fontsize=13,
        fontweight="bold",
    )
    fig.tight_layout()
    return fig


def draw_layer_comparison(frame: pd.DataFrame, source: str, options: Mapping[str, Any]) -> plt.Figure:
    """Head-averaged curve of every layer with a ±1 std band over heads."""
    metric = options["metric"]
    curves, info = last_block_curves(frame, options["step"], metric)
    layers = sorted(curves.index.get_level_values("layer").unique())
    colors = plt.cm.viridis(np.linspace(0.1, 0.9, len(layers)))
    fig, ax = plt.subplots(figsize=(13, 5))
    for color, layer in zip(colors, layers):
        per_head = curves.loc[layer]
        mean, std = per_head.mean(axis=0), per_head.std(axis=0, ddof=0)
        frames = mean.index.to_numpy()
        ax.plot(frames, mean.to_numpy(), "o-", color=color, linewidth=1.8, markersize=4, label=f"L{layer + 1}")
        ax.fill_between(frames, (mean - std).to_numpy(), (mean + std).to_numpy(), color=color, alpha=0.15)
    ax.set_xlabel("Key Frame Index")
    ax.set_ylabel(f"Head-averaged {METRIC_LABELS[metric][0].lower()}{METRIC_LABELS[metric][1:]}")
    _key_ticks(ax, sorted(curves.columns))
    ax.set_title(f"Cross-layer head-averaged attention (±1 std over heads)\n{_subtitle(source, info, metric)}", fontweight="bold")
    ncol = 1 if len(layers) <= 10 else math.ceil(len(layers) / 10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=ncol, fontsize=9, title="Layer")
    fig.tight_layout()
    return fig


def draw_first_middle_last(frame: pd.DataFrame, source: str, options: Mapping[str, Any]) -> plt.Figure:
    """First vs middle vs last key frame of the head-averaged curve, per layer."""
    metric = options["metric"]
    curves, info = last_block_curves(frame, options["step"], metric)
    layers = sorted(curves.index.get_level_values("layer").unique())
    stats = [curve_stats(curves.loc[layer].mean(axis=0).to_numpy(), curves.columns.to_numpy()) for layer in layers]
    x = np.arange(len(layers))
    width = 0.26
    fig, ax = plt.subplots(figsize=(max(7, 0.55 * len(layers) + 3), 4.8))
    for offset, key, label, color in ((-width, "first", "First frame", "#2E86AB"), (0, "middle", "Middle frames", "#F18F01"),
                                      (width, "last", "Last frame", "#A23B72")):  # fmt: skip
        ax.bar(x + offset, [s[key] for s in stats], width, label=label, color=color)
    ax.axhline(0, color="0.3", linewidth=0.6)
    ax.set_xticks(x)
    ax.set_xticklabels([f"L{layer + 1}" for layer in layers])
    ax.set_xlabel("Layer")
    ax.set_ylabel(METRIC_LABELS[metric])
    ax.set_title(f"Attention to the first, middle and last key frames\n{_subtitle(source, info, metric)}", fontweight="bold")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def draw_sink_score_overview(frame: pd.DataFrame, source: str, options: Mapping[str, Any]) -> plt.Figure:
    """Sink score (first - middle key frames) of every layer x head, in one heatmap."""
    metric = options["metric"]
    curves, info = last_block_curves(frame, options["step"], metric)
    scores = pd.Series(
        {key: curve_stats(row.to_numpy(), curves.columns.to_numpy())["sink_score"] for key, row in curves.iterrows()}
    ).unstack()
    layers, heads = list(scores.index), list(scores.columns)
    values = scores.to_numpy(dtype=float)
    finite = values[np.isfinite(values)]
    vmax = float(np.abs(finite).max()) if finite.size else 1.0
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(heads) + 3), max(3.5, 0.38 * len(layers) + 2)))
    sns.heatmap(
        scores, ax=ax, cmap="RdBu_r", center=0, vmin=-vmax, vmax=vmax, annot=len(layers) * len(heads) <= 400,
        fmt=".2f", annot_kws={"fontsize": 7}, linewidths=0.3, linecolor="white",
        cbar_kws={"label": f"sink score = first - middle ({METRIC_SHORT[metric]})"},
    )  # fmt: skip
    ax.set_xticklabels([f"H{h + 1}" for h in heads], rotation=0)
    ax.set_yticklabels([f"L{layer + 1}" for layer in layers], rotation=0)
    ax.set_xlabel("Head")
    ax.set_ylabel("Layer")
    ax.set_title(f"Sink score of every head\n{_subtitle(source, info, metric)}", fontweight="bold")
    fig.tight_layout()
    return fig


# -- layer figures -------------------------------------------------------------------------


def _head_grid(panels: int, *, width: float, row_height: float, sharex: bool = False):
    """Four panels a row, one per head; the unused panels of the last row hidden."""
    nrows = math.ceil(panels / 4)
    fig, axes = plt.subplots(nrows, 4, figsize=(width, row_height * nrows), squeeze=False, sharex=sharex)
    for ax in axes.flat[panels:]:
        ax.axis("off")
    return fig, axes


def draw_per_head_grid(frame: pd.DataFrame, source: str, layer: int, options: Mapping[str, Any]) -> plt.Figure:
    """One bar chart per head of the layer, titled with its sink score."""
    metric = options["metric"]
    curves, info = last_block_curves(frame, options["step"], metric)
    per_head = curves.loc[layer]
    heads = list(per_head.index)
    fig, axes = _head_grid(len(heads), width=14, row_height=2.9, sharex=True)
    color = sns.color_palette("colorblind")[0]
    for ax, head in zip(axes.flat, heads):
        values = per_head.loc[head].dropna()
        stats = curve_stats(values.to_numpy(), values.index.to_numpy())
        ax.bar(values.index, values.to_numpy(), alpha=0.85, width=0.8, color=color)
        ax.plot(values.index, values.to_numpy(), "o-", color="black", linewidth=1, markersize=2)
        ax.axhline(0, color="0.3", linewidth=0.5)
        ax.set_title(f"H{head + 1} (sink={stats['sink_score']:+.2f})", fontsize=10, fontweight="bold")
        ax.tick_params(axis="both", labelsize=7)
        frames = list(values.index)
        if len(frames) > 10:
            ax.set_xticks([frames[0], frames[len(frames) // 2], frames[-1]])
    fig.supxlabel("Key Frame Index", fontsize=11)
    fig.supylabel(METRIC_LABELS[metric], fontsize=11)
    fig.suptitle(
        f"Layer L{layer + 1} (index {layer}): per-head attention, query frames {_frames_text(info['query_frames'])}\n"
        f"sink = first key frame − mean of middle key frames · {_subtitle(source, info, metric)}",
        fontsize=12,
        fontweight="bold",
    )
    fig.tight_layout()
    return fig


def draw_heads_heatmap(frame: pd.DataFrame, source: str, layer: int, options: Mapping[str, Any]) -> plt.Figure:
    """Heads x key frames of the last block's query-averaged attention."""
    metric = options["metric"]
    curves, info = last_block_curves(frame, options["step"], metric)
    per_head = curves.loc[layer]
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * per_head.shape[1] + 3), 0.42 * per_head.shape[0] + 2.2))
    image = ax.imshow(per_head.to_numpy(dtype=float), cmap="viridis", aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=ax).set_label(METRIC_LABELS[metric])
    ax.set_yticks(range(per_head.shape[0]))
    ax.set_yticklabels([f"H{h + 1}" for h in per_head.index])
    frames = list(per_head.columns)
    step = 1 if len(frames) <= 25 else math.ceil(len(frames) / 12)
    ax.set_xticks(range(0, len(frames), step))
    ax.set_xticklabels(frames[::step])
    ax.set_xlabel("Key Frame Index")
    ax.set_ylabel("Attention Head")
    ax.grid(False)
    ax.set_title(
        f"Layer L{layer + 1} (index {layer}): attention of query frames {_frames_text(info['query_frames'])} across all heads\n"
        f"{_subtitle(source, info, metric)}",
        fontweight="bold",
    )
    fig.tight_layout()
    return fig


def draw_query_key_maps(frame: pd.DataFrame, source: str, layer: int, options: Mapping[str, Any]) -> plt.Figure:
    """Every head's query frame x key frame map over the whole video (blank = not visible)."""
    metric = options["metric"]
    matrices, frames, info = full_matrices(frame, options["step"], metric)
    axis_name = "Frame"
    if options.get("video_frames"):
        # Expand latent frames to the 4x video frames they decode to.
        video = np.arange(VAE_TEMPORAL_STRIDE * (frames[-1]) + 1)
        index = np.searchsorted(frames, latent_of_video_frame(video))
        matrices = matrices[:, index][:, :, index]
        frames = list(video)
        axis_name = "Video Frame"
    heads = info["heads"]
    fig, axes = _head_grid(len(heads), width=16, row_height=3.9)
    finite = matrices[np.isfinite(matrices)]
    if metric == "logit_mean":
        vmax = float(np.abs(finite).max()) if finite.size else 1.0
        cmap, vmin = "RdBu_r", -vmax
    else:
        cmap, vmin, vmax = "magma", 0.0, float(finite.max()) if finite.size else 1.0
    colormap = plt.get_cmap(cmap).with_extremes(bad="0.92")
    n = len(frames)
    ticks = sorted({0, n // 2, n - 1})
    image = None
    for ax, head, matrix in zip(axes.flat, heads, matrices):
        image = ax.imshow(np.ma.masked_invalid(matrix), cmap=colormap, vmin=vmin, vmax=vmax, origin="lower",
                          aspect="auto", interpolation="nearest")  # fmt: skip
        ax.set_title(f"H{head + 1}", fontsize=11, fontweight="bold")
        ax.set_xticks(ticks)
        ax.set_xticklabels([frames[t] for t in ticks])
        ax.set_yticks(ticks)
        ax.set_yticklabels([frames[t] for t in ticks])
        ax.set_xlabel(f"Key {axis_name}", fontsize=9)
        ax.set_ylabel(f"Query {axis_name}", fontsize=9)
        ax.grid(False)
    fig.suptitle(
        f"Layer L{layer + 1} (index {layer}): query x key {axis_name.lower()} attention, all heads\n"
        f"{_subtitle(source, info, metric)} · grey = not visible",
        fontsize=13,
        fontweight="bold",
    )
    fig.tight_layout(rect=(0, 0, 0.92, 1))
    if image is not None:
        cax = fig.add_axes((0.935, 0.15, 0.015, 0.7))
        fig.colorbar(image, cax=cax).set_label(METRIC_LABELS[metric])
    return fig


SOURCE_DRAWERS = {
    "figure4": draw_figure4,
    "layer_comparison": draw_layer_comparison,
    "first_middle_last": draw_first_middle_last,
    "sink_score_overview": draw_sink_score_overview,
}
LAYER_DRAWERS = {
    "per_head_grid": draw_per_head_grid,
    "heads_heatmap": draw_heads_heatmap,
    "query_key_maps": draw_query_key_maps,
}


def draw(kind: str, frame: pd.DataFrame, *, source: str, layer: int | None, options: Mapping[str, Any]) -> plt.Figure:
    """Draw figure ``kind`` (a source figure, or a layer figure when ``layer`` is given)."""
    if frame.empty:
        raise ValueError(f"no frame_attention rows to draw {kind} of {source}")
    with figure_style():
        if kind in SOURCE_DRAWERS:
            return SOURCE_DRAWERS[kind](frame, source, options)
        if kind in LAYER_DRAWERS:
            if layer is None:
                raise ValueError(f"figure {kind} needs a layer")
            rows = frame[frame["layer"] == layer]
            if rows.empty:
                raise ValueError(f"no rows of layer {layer} to draw {kind} of {source}")
            return LAYER_DRAWERS[kind](rows, source, layer, options)
    raise ValueError(f"unknown figure {kind!r}; known: {', '.join(list(SOURCE_DRAWERS) + list(LAYER_DRAWERS))}")
