"""Sink collapse on one time axis: does the video return to its sink frames where the
attention to them rises, and where a temporal RoPE channel completes a turn?

Block by block (x: the block's first latent frame), for each variant of the checkpoint:
the softmax mass on the sink frames (block_stats ``sink_mass``, mean over layers, heads
and runs) beside uniform attention (``sink_uniform``); the generated latents' cosine
similarity to the sink frames (``latent_sink_cosine``) and to the previous block
(``latent_previous_cosine``). Vertical lines mark where a temporal RoPE channel pair
completes a turn (``rope_periods``; periods of 16 frames and more).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from sinkscope.figures.colours import PANEL_COLORS
from sinkscope.figures.layout import finish, new_figure
from sinkscope.figures.marks import band_handle, line_handle
from sinkscope.figures.text import subtitle
from sinkscope.figures.views import (
    every_block_call,
    run_count,
    step_of,
    table,
    variants_in,
)

VALUES = ("sink_mass", "sink_uniform", "latent_sink_cosine", "latent_previous_cosine")


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], **_: Any):
    kind = "sink_collapse"
    stats = table(tables, "block_stats", kind)
    if "latent_sink_cosine" not in stats:
        raise ValueError(
            f"figure {kind} needs block_stats with latent_sink_cosine (written by this sinkscope's aggregation)"
        )
    pass_, index = step_of(stats, options.get("step") or "last")
    rows = stats[(stats["pass"] == pass_) & (stats["step"] == index)]
    # Blocks without a sink frame in their cache (block 0) have no sink mass: left out.
    rows = rows.assign(
        first_frame=rows["query_frames"].astype(str).str.split("-").str[0].astype(int),
        sink_mass=rows["sink_mass"].where(rows["sink_uniform"].notna()),
    ).astype({v: float for v in VALUES})
    variants = variants_in(rows)
    runs = run_count(rows)
    colors = {v: PANEL_COLORS[i % len(PANEL_COLORS)] for i, v in enumerate(variants)}
    fig = new_figure(7.6, 5.6)
    attention, video = fig.subplots(2, 1, sharex=True)
    for variant in variants:
        mine = rows[rows["variant"] == variant]
        per_run = mine.groupby(["first_frame", "prompt_id", "seed"], observed=True)[list(VALUES)].mean()
        mean = per_run.groupby("first_frame").mean()
        std = per_run.groupby("first_frame").std(ddof=1)
        x, color = mean.index.to_numpy(), colors[variant]
        for panel, name, style in (
            (attention, "sink_mass", "o-"),
            (attention, "sink_uniform", ":"),
            (video, "latent_sink_cosine", "o-"),
            (video, "latent_previous_cosine", "s--"),
        ):
            (line,) = panel.plot(x, mean[name].to_numpy(), style, color=color, lw=1.4, ms=3)
            line.set_gid(f"{name.replace('_', '-')}-{variant}")
            if runs >= 2 and name != "sink_uniform":
                band = panel.fill_between(
                    x,
                    (mean[name] - std[name]).to_numpy(),
                    (mean[name] + std[name]).to_numpy(),
                    color=color,
                    alpha=0.15,
                    lw=0,
                )
                band.set_gid(f"spread-{name.replace('_', '-')}-{variant}")
    marks = _rope_marks(rows)
    for position, label in marks:
        for panel in (attention, video):
            panel.axvline(position, color="0.55", lw=0.8, ls=(0, (2, 2)), zorder=0.5)
        attention.annotate(
            label,
            (position, 1.0),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            rotation=90,
            va="top",
            ha="right",
            color="0.35",
        )
    attention.set_ylabel("mass on the sink frames")
    attention.set_ylim(bottom=0)
    video.set_ylabel("latent cosine similarity")
    video.set_xlabel("latent frame (the block's first)")
    handles = [line_handle(colors[v], v, marker="o", ms=3) for v in variants]
    handles += [
        line_handle("0.3", "mass uniform attention would give the sink frames", ls=":"),
        line_handle("0.3", "latents: to the sink frames", marker="o", ms=3),
        line_handle("0.3", "latents: to the previous block", marker="s", ms=3, ls="--"),
    ]
    handles += [band_handle("0.5")] if runs >= 2 else []
    if marks:
        handles.append(line_handle("0.55", "a temporal RoPE channel pair completes a turn", lw=0.8, ls=(0, (2, 2))))
    call = every_block_call(rows, pass_, index)
    return finish(
        fig,
        title="Sink collapse: attention to the sink frames and the video's return to them, on one time axis",
        subtitle=subtitle(source, call, "block_stats", runs, "bands ±1 std between runs" if runs >= 2 else None),
        legend=handles,
        caption=(
            "Upper panel: the softmax mass of each block's queries on the sink frames (frame 0 without a sink "
            "policy), mean over layers, heads and runs, and what uniform attention would give them (dotted). Lower "
            "panel: the mean cosine similarity of the block's latent frames to the sink frames and to the previous "
            "block (raw latents: a static background keeps them high; what matters is how they move). "
            + (
                "Dashed verticals: positions where a temporal RoPE channel pair completes a turn (c<pair>@frame; "
                "LoL reports collapses at such indices)."
                if marks
                else "No temporal RoPE channel with a period of 16 frames or more completes a turn in these frames."
            )
        ),
    )


def _rope_marks(rows: pd.DataFrame) -> list[tuple[float, str]]:
    """(position, label) of every RoPE turn named in the rows' ``rope_periods``."""
    marks = {}
    for text in rows["rope_periods"].dropna().astype(str).unique():
        for item in text.split():
            pair, _, position = item.partition("@")
            marks[float(position)] = item
    return sorted(marks.items())
