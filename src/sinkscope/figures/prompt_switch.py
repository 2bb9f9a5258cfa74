"""What a prompt switch does to the attention: around each switch of a prompt schedule,
block by block, the softmax mass on the sink (frame 0) and on the frames generated
before the switch (under the earlier prompt), one line per variant of the checkpoint
(re-cache on and off, say), averaged over layers, heads and seeds, with a ±1 std band
over the layers' heads. The re-cache pass (when captured) is marked on the switch line:
the mass its queries, the kept frames recomputed under the new prompt, put on frame 0."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from sinkscope.figures.colours import PANEL_COLORS
from sinkscope.figures.layout import finish, new_figure, outer_labels
from sinkscope.figures.marks import line_handle
from sinkscope.figures.style import option
from sinkscope.figures.text import subtitle
from sinkscope.figures.views import (
    block_call_rows,
    one_checkpoint,
    run_count,
    table,
    variants_in,
)

# Blocks shown on each side of a switch.
AROUND = 4
LINE_STYLES = ("-", "--", ":", "-.")
MEASURES = (("sink", "sink mass (frame 0)"), ("before", "mass on pre-switch frames"))


def switches_of(frame: pd.DataFrame) -> list[tuple[str, int, int, int]]:
    """(prompt, segment, first block, switch frame) of every switch in the rows."""
    found = []
    denoise = frame[frame["pass"] == "denoise"]
    for prompt, rows in denoise.groupby("prompt_id", observed=True, sort=True):
        firsts = rows.groupby("prompt_segment", observed=True).agg(block=("block", "min"), frame=("query_frame", "min"))
        for segment, first in firsts.sort_index().iloc[1:].iterrows():
            found.append((str(prompt), int(segment), int(first["block"]), int(first["frame"])))
    return found


def block_masses(rows: pd.DataFrame, switch_frame: int) -> pd.DataFrame:
    """Per variant, layer, head and block: the sink mass and the mass on frames 1 ..
    switch_frame - 1 outside the block (queries and seeds averaged)."""
    keys = ["variant", "layer", "head", "block"]
    per_frame = rows.groupby([*keys, "seed", "key_frame"], observed=True).agg(
        mass=("prob_mass", "mean"), own=("query_frame", "min")
    )
    per_frame = per_frame.reset_index()
    outside = per_frame["key_frame"] < per_frame["own"]
    sink = per_frame["mass"].where(outside & (per_frame["key_frame"] == 0))
    before = per_frame["mass"].where(
        outside & (per_frame["key_frame"] >= 1) & (per_frame["key_frame"] < switch_frame), 0.0
    )
    per_frame = per_frame.assign(sink=sink, before=before)
    per_seed = per_frame.groupby([*keys, "seed"], observed=True).agg(
        sink=("sink", "sum"), before=("before", "sum"), seen=("sink", "count")
    )
    per_seed.loc[per_seed["seen"] == 0, "sink"] = np.nan  # frame 0 is the block's own (block 0)
    return per_seed.groupby(keys, observed=True)[["sink", "before"]].mean()


def recache_sink(frame: pd.DataFrame, prompt: str, block: int) -> pd.Series:
    """Per variant: the re-cache pass's mass on frame 0 (queries other than frame 0)."""
    rows = frame[(frame["pass"] == "recache") & (frame["prompt_id"] == prompt) & (frame["block"] == block)]
    rows = rows[(rows["key_frame"] == 0) & (rows["query_frame"] != 0)]
    return rows.groupby("variant", observed=True)["prob_mass"].mean()


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "prompt_switch"
    if ax is not None:
        raise ValueError(f"{kind} is a grid of panels; it draws its own figure (leave ax out)")
    frame = table(tables, "frame_attention", kind)
    one_checkpoint(frame, kind)
    if "prompt_segment" not in frame.columns:
        raise ValueError(f"figure {kind} needs the prompt_segment column (rows of prompt schedules)")
    switches = switches_of(frame)
    if not switches:
        raise ValueError(f"figure {kind}: no prompt of the table switches (prompts: with segments)")
    step = option(options, "step")
    calls, call = block_call_rows(frame[frame["pass"] != "recache"], step)
    variants = variants_in(calls)
    colors = {v: PANEL_COLORS[i % len(PANEL_COLORS)] for i, v in enumerate(variants)}
    # Variants often agree before the switch: a dash of their own keeps every line visible.
    dashes = {v: LINE_STYLES[i % len(LINE_STYLES)] for i, v in enumerate(variants)}
    fig = new_figure(2 * 3.6, len(switches) * 2.5)
    axes = fig.subplots(len(switches), 2, squeeze=False)
    recached = False
    for row, (prompt, segment, first, switch_frame) in enumerate(switches):
        rows = calls[
            (calls["prompt_id"] == prompt) & (calls["block"] >= first - AROUND) & (calls["block"] < first + AROUND)
        ]
        masses = block_masses(rows, switch_frame)
        heads = masses.groupby(["variant", "block"], observed=True)
        mean, std = heads.mean(), heads.std(ddof=0)
        marks = recache_sink(frame, prompt, first)
        for col, (measure, label) in enumerate(MEASURES):
            ax_ = axes[row, col]
            for variant in variants:
                if variant not in mean.index.get_level_values("variant"):
                    continue
                m, s = mean.loc[variant, measure], std.loc[variant, measure].fillna(0)
                (line,) = ax_.plot(
                    m.index, m.to_numpy(), marker="o", ls=dashes[variant], color=colors[variant], lw=1.5, ms=3
                )
                line.set_gid(f"{measure}-{variant}-{prompt}-{segment}")
                ax_.fill_between(
                    m.index, (m - s).to_numpy(), (m + s).to_numpy(), color=colors[variant], alpha=0.15, lw=0
                )
                if measure == "sink" and variant in marks.index:
                    recached = True
                    ax_.plot(
                        [first - 0.5],
                        [float(marks[variant])],
                        "*",
                        color=colors[variant],
                        ms=9,
                        mec="black",
                        mew=0.5,
                        zorder=4,
                    )
            ax_.axvline(first - 0.5, color="0.2", ls="--", lw=1.0, zorder=1).set_gid(f"switch-{prompt}-{segment}")
            ax_.set_xlim(first - AROUND - 0.5, first + AROUND - 0.5)
            ax_.set_ylim(bottom=0)
            blocks = list(range(max(0, first - AROUND), first + AROUND))
            ax_.set_xticks(blocks, labels=[str(b) for b in blocks])
            ax_.set_title(f"{label}\n{prompt}: segment {segment} from frame {switch_frame}", fontsize=9)
    outer_labels(list(axes.ravel()), "block", "softmax mass")
    handles = [line_handle(colors[v], v, marker="o", ms=3, ls=dashes[v]) for v in variants]
    handles.append(line_handle("0.2", "prompt switch", ls="--", lw=1.0))
    if recached:
        handles.append(
            Line2D(
                [],
                [],
                color="0.5",
                marker="*",
                ls="none",
                ms=9,
                mec="black",
                mew=0.5,
                label="re-cache pass (frame-0 mass of the recomputed frames)",
            )
        )
    return finish(
        fig,
        title="Attention around each prompt switch, block by block",
        subtitle=subtitle(source, call, "softmax mass (prob_mass)", run_count(calls)),
        legend=handles,
        caption=(
            f"Left: the mass of each block's queries on frame 0 (the sink; the block's own frames excluded); "
            f"right: on frames 1 to the switch frame - 1, generated under the earlier prompt. {AROUND} blocks on "
            "each side of a switch; mean over layers, heads and seeds, band ±1 std over heads. Star: the re-cache "
            "pass that recomputes the kept frames under the new prompt before the switch block (generation.re_cache)."
        ),
    )
