"""Deep Forcing Figure 4 at the paper's resolution: for each head in ``heads``, a filled
curve of the last block's query-averaged score of every key token, x = key frame +
token / frame_seq_length, with frame ticks, the query block shaded, gaps where frames are
not in the KV cache, and each frame's mean over its tokens (for logits the bar of
``figure4``; for softmax probabilities the frame's mass / its tokens) as black segments
with ±1 std between runs; on probabilities, the uniform baseline 1 / key tokens seen."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from sinkscope.figures.colours import PANEL_COLORS, darker
from sinkscope.figures.layout import finish, message_panel, panels, set_frame_ticks
from sinkscope.figures.marks import (
    UNIFORM_STYLE,
    error_bars,
    gap_handle,
    line_handle,
    mark_gaps,
    mark_own,
    own_handle,
    spread_handle,
    uniform_handle,
)
from sinkscope.figures.style import heads_of, option
from sinkscope.figures.text import (
    METRIC_SHORT,
    class_text,
    frames_text,
    head_text,
    metric_axis_label,
    runs_of,
    subtitle,
)
from sinkscope.figures.views import (
    View,
    difference_text,
    excess_text,
    figure4_view,
    head_classes,
    layers_of,
    mass_view,
    one_source,
    run_count,
    table,
)
from sinkscope.naming import head_label

COLUMNS = {"logit_mean": "token_logit_mean", "prob_mass": "token_prob_mean"}
WHAT = {
    "logit_mean": "pre-softmax q·k/√d of every key token",
    "prob_mass": "softmax probability of every key token",
}


def chosen_tokens(tokens: pd.DataFrame, view: View) -> pd.DataFrame:
    """The rows of the view's call in the last block of each run."""
    rows = tokens[(tokens["pass"] == view.pass_) & (tokens["step"] == view.step)]
    if rows.empty:
        return rows
    last = rows.groupby(["prompt_id", "seed"], observed=True)["block"].transform("max")
    return rows[rows["block"] == last]


def frame_length(tokens: pd.DataFrame, grid: Sequence[int] | None) -> int:
    if grid:
        return int(grid[0]) * int(grid[1])
    return int(tokens["token"].max()) + 1


def profile(tokens: pd.DataFrame, layer: int, head: int, column: str) -> pd.Series:
    """Runs-averaged token profile of one head: index (key_frame, token)."""
    rows = tokens[(tokens["layer"] == layer) & (tokens["head"] == head)]
    return rows.groupby(["key_frame", "token"], observed=True)[column].mean().sort_index()


def token_means(view: View, layer: int, head: int, tokens: pd.Series) -> tuple[pd.Series, pd.Series | None]:
    """Each frame's mean over its tokens, and its std between runs: the frame curve itself
    for logits (a mean over token pairs); for probabilities the frame's mass / its tokens."""
    means, std = view.curve(layer, head), view.std(layer, head)
    if view.metric == "prob_mass":
        means = means / tokens.reindex(means.index)
        std = std / tokens.reindex(std.index) if std is not None else None
    return means, std


def panel(
    ax,
    view: View,
    values: pd.Series,
    layer: int,
    head: int,
    *,
    length: int,
    color: str,
    base: int,
    width: float,
    tokens: pd.Series,
) -> bool:
    frames = view.frames.astype(int)
    present = sorted({int(f) for f in values.index.get_level_values("key_frame")})
    missing = [f for f in frames if f not in present]
    mark_gaps(ax, frames, missing, left=0.0, gid=f"gap-{head_label(layer, head)}")
    mark_own(ax, view.query_frames, left=0.0, gid=f"own-block-{head_label(layer, head)}")
    key = values.index.get_level_values("key_frame").to_numpy()
    x = key + values.index.get_level_values("token").to_numpy() / length
    y = values.to_numpy(dtype=float)
    for a, b in runs_of(present):
        sel = (key >= a) & (key <= b)
        ax.fill_between(x[sel], 0, y[sel], color=color, alpha=0.5, lw=0, rasterized=True, zorder=2)
        ax.plot(x[sel], y[sel], color=darker(color), lw=0.3, rasterized=True, zorder=2.2)
    if view.has(layer, head):
        means, std = token_means(view, layer, head, tokens)
        shown = means.dropna()
        ax.hlines(
            shown.to_numpy(), shown.index.to_numpy(), shown.index.to_numpy() + 1, color="black", lw=1.0, zorder=3
        ).set_gid(f"frame-means-{head_label(layer, head)}")
        if std is not None:
            error_bars(
                ax,
                shown.index.to_numpy() + 0.5,
                shown.to_numpy(),
                std.reindex(shown.index).to_numpy(),
                gid=head_label(layer, head),
            )
        if view.metric == "prob_mass":
            # Uniform over every key token seen: the same probability for each of them.
            seen = float(tokens.reindex(shown.index).sum())
            if seen > 0:
                ax.axhline(1.0 / seen, **UNIFORM_STYLE).set_gid(f"uniform-{head_label(layer, head)}")
    ax.axhline(0, color="0.3", lw=0.6, zorder=2.5)
    ax.set_xlim(frames[0], frames[-1] + 1)
    ax.grid(False, axis="x")
    ax.set_xticks(range(int(frames[0]), int(frames[-1]) + 2), minor=True)
    ax.grid(True, which="minor", axis="x", color="0.88", lw=0.5, ls="-")
    set_frame_ticks(ax, frames, base, offset=0.5, length=width)
    ax.tick_params(axis="x", which="minor", length=0)
    return bool(missing)


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], grid=None, ax=None, **_: Any):
    kind = "figure4_tokens"
    frame = one_source(table(tables, "frame_attention", kind), kind)
    tokens = one_source(table(tables, "token_profiles", kind), kind)
    metric, base = option(options, "metric"), int(option(options, "frame_base"))
    column = COLUMNS[metric]
    heads = heads_of(options)
    rows = layers_of(frame, heads)
    view = figure4_view(rows, option(options, "step"), metric)
    mass = mass_view(rows, view)
    classes, classes_from = head_classes(tables.get("head_diagnostics"), rows, view)
    tokens = chosen_tokens(tokens, view)
    if tokens.empty:
        raise ValueError(
            f"figure {kind}: no token profiles of the last block for {view.call} "
            "(capture.token_profiles: last_block or all)"
        )
    length = frame_length(tokens, grid)
    ncols = 1 if len(heads) == 1 else 2 if len(heads) <= 4 else 3
    width = {1: 10.0, 2: 7.0, 3: 5.2}[ncols]
    given = ax is not None
    fig, axes = panels(ax, len(heads), kind=kind, one="head (heads=['L1H1'])", ncols=ncols, panel=(width, 3.7))
    gaps = False
    for index, (ax_, (label, layer, head)) in enumerate(zip(axes, heads)):
        values = profile(tokens, layer, head, column)
        ax_.set_title(head_text(layer, head), fontweight="bold")
        if values.empty:
            message_panel(ax_, f"no token profiles of {label}\n(token capture covers the heads of figures.heads)")
            continue
        counts = frame_tokens(tokens, layer, head)
        gaps |= panel(
            ax_,
            view,
            values,
            layer,
            head,
            length=length,
            color=PANEL_COLORS[index % len(PANEL_COLORS)],
            base=base,
            width=width - 0.8,
            tokens=counts,
        )
        if view.has(layer, head):
            ax_.set_title(
                f"{head_text(layer, head)} · {class_text(classes.get((layer, head)))}\n"
                f"{excess_text(mass, layer, head, spread=True)} · {difference_text(view, layer, head)}",
                fontweight="bold",
                fontsize=10,
            )
        ax_.set_xlabel("key frame (token resolution)")
        ax_.set_ylabel(metric_axis_label(metric) if metric != "prob_mass" else "probability per key token")
    if given:
        return ax.figure
    runs = run_count(tokens)
    shape = f"{int(grid[0])} x {int(grid[1])} patch grid" if grid else f"{length} tokens a frame"
    mean_label = "frame mean (the bar of figure4)" if metric != "prob_mass" else "frame mean (its mass / its tokens)"
    legend = [own_handle(view.query_frames, base), line_handle("black", mean_label, lw=1.0)]
    legend += [gap_handle()] if gaps else []
    legend += [uniform_handle("uniform: 1 / key tokens seen")] if metric == "prob_mass" else []
    legend += [spread_handle("frame mean ±1 std between runs")] if view.runs >= 2 else []
    return finish(
        fig,
        title="Token-resolution attention of the last block (Deep Forcing Fig. 4)",
        subtitle=subtitle(source, view.call, METRIC_SHORT[metric], runs, "frame means ±1 std between runs"),
        legend=legend,
        caption=(
            f"Plotted: {WHAT[metric]}, queries averaged over the last block (frames "
            f"{frames_text(view.query_frames, base)}), call: {view.call}. "
            f"x = key frame + token / {length} (tokens row-major over the {shape}). Titles: the head's class "
            f"({classes_from}); frame-0 excess = softmax mass on frame 0 − its uniform share (1 / visible frames), ± "
            "the std between runs; first − middle: the frame curve's first cache frame − mean of the cache frames "
            "between (sinkscope.stats.summaries)."
        ),
    )


def frame_tokens(tokens: pd.DataFrame, layer: int, head: int) -> pd.Series:
    """Key tokens present per key frame in one head's token profiles (one run's count)."""
    rows = tokens[(tokens["layer"] == layer) & (tokens["head"] == head)]
    per_run = rows.groupby(["prompt_id", "seed", "key_frame"], observed=True)["token"].size()
    return per_run.groupby("key_frame", observed=True).mean().astype(float)
