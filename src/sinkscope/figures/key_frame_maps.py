"""Where in the picture the attention lands: for each head of ``heads``, the token profile
of the first frame it sees (frame 0 unless evicted) and of its most attended other
frames, reshaped to the latent patch grid (30 x 52 for Wan2.1 at 480x832). Each title
gives the frame's softmax mass (± the std between runs) beside its uniform share; the
head's class (head_diagnostics) is in its first title, "sink" only for sink-class heads.

The frames are chosen on the frame-level softmax mass of the last block
(``summaries.figure4_curves``); each head's row shares one colour scale, so its frames
compare. ``metric`` picks the token statistic: prob_mass (default here: the softmax
probability of each key token) or logit_mean (its pre-softmax score)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from sinkscope.figures.colours import colour_scale, colourbar, heat
from sinkscope.figures.layout import finish, message_panel, new_figure
from sinkscope.figures.style import heads_of, option
from sinkscope.figures.text import (
    METRIC_SHORT,
    class_text,
    frames_text,
    number,
    subtitle,
)
from sinkscope.figures.views import (
    figure4_view,
    head_classes,
    layers_of,
    one_source,
    run_count,
    table,
)

COLUMNS = {"logit_mean": "token_logit_mean", "prob_mass": "token_prob_mean"}
TOP = 3  # most attended frames beside the sink frame


def grid_shape(tokens: int, grid: Sequence[int] | None) -> tuple[int, int]:
    """The latent patch grid; without metadata, the factorization of the token count
    nearest to Wan's 30:52 aspect."""
    if grid:
        return int(grid[0]), int(grid[1])
    pairs = [(r, tokens // r) for r in range(1, int(tokens**0.5) + 1) if tokens % r == 0]
    return min(pairs, key=lambda p: abs(np.log(p[1] / p[0]) - np.log(52 / 30)))


def chosen_frames(masses: pd.Series, first: int) -> list[tuple[int, str]]:
    """(frame, why) of the first frame the head sees and its most attended other frames."""
    chosen = [(first, "first frame it sees")] if first >= 0 else []
    others = masses.drop(index=first, errors="ignore").dropna().sort_values(ascending=False, kind="stable")
    chosen += [(int(f), f"#{rank + 1} most attended") for rank, f in enumerate(others.index[:TOP])]
    return chosen


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], grid=None, ax=None, **_: Any):
    kind = "key_frame_maps"
    if ax is not None:
        raise ValueError(f"{kind} is a grid of panels; it draws its own figure (leave ax out)")
    frame = one_source(table(tables, "frame_attention", kind), kind)
    tokens = one_source(table(tables, "token_profiles", kind), kind)
    metric = options.get("metric") or "prob_mass"
    base = int(option(options, "frame_base"))
    frame = layers_of(frame, heads_of(options))
    masses = figure4_view(frame, option(options, "step"), "prob_mass")
    view = masses if metric == "prob_mass" else figure4_view(frame, option(options, "step"), metric)
    classes, classes_from = head_classes(tables.get("head_diagnostics"), frame, masses)
    rows = tokens[(tokens["pass"] == view.pass_) & (tokens["step"] == view.step)]
    if not rows.empty:
        rows = rows[rows["block"] == rows.groupby(["prompt_id", "seed"], observed=True)["block"].transform("max")]
    if rows.empty:
        raise ValueError(f"figure {kind}: no token profiles of the last block for {view.call}")
    length = int(rows["token"].max()) + 1 if not grid else int(grid[0]) * int(grid[1])
    shape = grid_shape(length, grid)
    heads = heads_of(options)
    ncols = 1 + TOP
    panel_w = 2.7 if shape[1] >= shape[0] else 2.0
    panel_h = max(1.3, panel_w * shape[0] / shape[1]) + 0.45
    fig = new_figure(ncols * panel_w + 0.9, len(heads) * panel_h)
    axes = fig.subplots(len(heads), ncols, squeeze=False)
    for r, (label, layer, head) in enumerate(heads):
        cells = axes[r]
        own = rows[(rows["layer"] == layer) & (rows["head"] == head)]
        if own.empty or not masses.has(layer, head):
            message_panel(cells[0], f"no token profiles of {label}")
            for a in cells[1:]:
                a.set_visible(False)
            cells[0].set_title(label, fontweight="bold", fontsize=9)
            continue
        profile = own.groupby(["key_frame", "token"], observed=True)[COLUMNS[metric]].mean()
        stats = masses.stats(layer, head)
        picks = chosen_frames(masses.curve(layer, head), stats["first_frame"])
        spread, uniform = masses.std(layer, head), masses.baseline(layer, head)
        images = {}
        for f, _ in picks:
            values = np.full(shape[0] * shape[1], np.nan)
            if f in profile.index.get_level_values("key_frame"):
                part = profile.loc[f]
                values[part.index.to_numpy().astype(int)] = part.to_numpy(dtype=float)
            if metric == "prob_mass":
                # Where inside the frame: each token's share of the frame's mass, x the token
                # count (1 = a uniform spread); the frame's own mass is in the title.
                values = values / np.nansum(values) * np.isfinite(values).sum() if np.nansum(values) > 0 else values
            images[f] = values.reshape(shape)
        shown = np.concatenate([m.ravel() for m in images.values()])
        cmap, norm = colour_scale(shown, metric)
        image = None
        for i, (a, (f, why)) in enumerate(zip(cells, picks)):
            image = heat(a, images[f], cmap, norm)
            a.set_xticks([])
            a.set_yticks([])
            mass = masses.curve(layer, head).get(f, np.nan)
            std = spread.get(f, np.nan) if spread is not None else np.nan
            spread_text = f" ± {number(std, 'prob_mass')}" if np.isfinite(std) else ""
            own_frame = " (own)" if f in view.query_frames else ""
            who = f"{label} ({class_text(classes.get((layer, head)))})" if i == 0 else label
            a.set_title(
                f"{who} · frame {f + base}{own_frame}\n{why}\nmass {number(mass, 'prob_mass')}{spread_text}"
                f" · uniform {number(uniform.get(f, np.nan), 'prob_mass')}",
                fontsize=8,
            )
        for a in cells[len(picks) :]:
            a.set_visible(False)
        if image is not None:
            bar_label = (
                "token mass, x uniform\nwithin the frame"
                if metric == "prob_mass"
                else "token logit q·k/√d\n(token_logit_mean)"
            )
            bar = colourbar(fig, image, shown, bar_label, fontsize=7.5, ax=list(cells), shrink=0.9, pad=0.01, aspect=12)
            bar.ax.tick_params(labelsize=7)
        cells[0].set_ylabel("patch row", fontsize=8)
    for a in axes[-1]:
        if a.get_visible():
            a.set_xlabel("patch column", fontsize=8)
    what = (
        (
            "softmax probability of each key token relative to a uniform spread over its frame (token_prob_mean / "
            "frame mass x tokens; 1 = uniform)"
        )
        if metric == "prob_mass"
        else "pre-softmax q·k/√d of each key token"
    )
    runs = run_count(rows)
    return finish(
        fig,
        title="Where the last block's attention lands in its key frames",
        subtitle=subtitle(
            source, view.call, f"token {METRIC_SHORT[metric]}", runs, "frame masses ± 1 std between runs in the titles"
        ),
        caption=(
            f"Each map: the {what}, queries averaged over the last block (frames "
            f"{frames_text(view.query_frames, base)}) and the runs, on the {shape[0]} x {shape[1]} latent patch "
            "grid (token = row x width + column). Frames: the first frame the head sees (frame 0 unless evicted) "
            "and its most attended other frames by frame-level softmax mass; titles: that mass (± the std between "
            "runs) and the uniform share of the frame (1 / visible frames, key tokens counted; "
            f"sinkscope.stats.summaries); the head's class ({classes_from}) beside its first frame. One colour "
            "scale a row; grey = token not present."
        ),
    )
