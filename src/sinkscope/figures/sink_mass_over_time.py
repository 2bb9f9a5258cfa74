"""Does the attention to frame 0 (or to the policy's sink frames) hold as the video grows?
Block by block, the softmax mass on those frames (block_stats ``sink_mass``) beside what
uniform attention over the key tokens would give them (``sink_uniform``: 1 / visible
frames per frame, so it falls as frames accumulate), and the excess over it
(``sink_excess``); averaged over heads and runs with a ±1 std band between runs, one
pair of panels per layer (a selection of up to twelve at many layers), one line per
variant of the checkpoint. Blocks whose cache holds none of those frames (block 0) have
no value: they are left out and shaded."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd
from matplotlib.patches import Patch

from sinkscope.figures.colours import GAP_COLOR, PANEL_COLORS
from sinkscope.figures.layout import finish, new_figure, set_label_ticks, share_y
from sinkscope.figures.marks import UNIFORM_COLOR, band_handle, line_handle
from sinkscope.figures.text import subtitle
from sinkscope.figures.views import (
    block_call_rows,
    evenly,
    one_checkpoint,
    run_count,
    table,
    variants_in,
)
from sinkscope.naming import layer_label

MOST_PANELS = 12
VALUES = ("sink_mass", "sink_uniform", "sink_excess")


def per_block(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """Mean and std between runs (of the head means) of each value, per variant, layer and
    block; NaN where no sink frame is in the cache. And the number of runs."""
    rows = rows.assign(sink_mass=rows["sink_mass"].where(rows["sink_uniform"].notna()))
    per_run = rows.groupby(["variant", "layer", "block", "prompt_id", "seed"], observed=True)[list(VALUES)].mean()
    grouped = per_run.groupby(["variant", "layer", "block"], observed=True)
    return grouped.mean(), grouped.std(ddof=1), run_count(rows)


def line_label(variant: str, sinks: str, variants: int, same_frames: bool) -> str:
    """A line's legend entry: with one variant, what the line is ('mass on frame 0 ...',
    named by its variant unless it is the untouched default); with several, the variant,
    and the frames its mass is on where variants differ in them ('sink (frames 0-2)')."""
    frames = "frame 0" if sinks == "0" else f"frames {sinks}"
    if variants == 1:
        named = "" if variant == "default" else f"{variant}: "
        return f"{named}mass on {frames} (upper panels), its excess over uniform (lower)"
    return variant if same_frames else f"{variant} ({frames})"


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "sink_mass_over_time"
    stats = table(tables, "block_stats", kind)
    one_checkpoint(stats, kind)
    if "sink_uniform" not in stats:
        raise ValueError(f"figure {kind} needs block_stats with sink_uniform (written by this sinkscope's aggregation)")
    step = options.get("step") or "last"
    rows, call = block_call_rows(stats, step)
    variants = variants_in(rows)
    layers = sorted(int(x) for x in rows["layer"].unique())
    shown = evenly(layers, MOST_PANELS)
    given = ax is not None
    ncols = len(shown) if len(shown) <= 4 else 3 if len(shown) in (5, 6, 9) else 4
    groups = math.ceil(len(shown) / ncols)
    if given:
        if len(shown) != 1:
            raise ValueError(f"{kind} draws into one axes only for one layer (layers=[...])")
        fig, pairs = ax.figure, [(ax, None)]
    else:
        fig = new_figure(ncols * 3.3, groups * 2 * 2.2)
        grid = fig.subplots(2 * groups, ncols, squeeze=False)
        pairs = [(grid[2 * (i // ncols), i % ncols], grid[2 * (i // ncols) + 1, i % ncols]) for i in range(len(shown))]
        for i in range(len(shown), groups * ncols):
            grid[2 * (i // ncols), i % ncols].remove()
            grid[2 * (i // ncols) + 1, i % ncols].remove()
    colors = {v: PANEL_COLORS[i % len(PANEL_COLORS)] for i, v in enumerate(variants)}
    mean, std, runs = per_block(rows)
    blocks = sorted(int(b) for b in rows["block"].unique())
    empty = [b for b in blocks if not rows.loc[rows["block"] == b, "sink_uniform"].notna().any()]
    for (top, bottom), layer in zip(pairs, shown):
        label = layer_label(layer)
        for panel in (top, bottom):
            if panel is None:
                continue
            for i, b in enumerate(empty):
                panel.axvspan(b - 0.5, b + 0.5, color=GAP_COLOR, lw=0, zorder=0.4).set_gid(f"no-cache-{label}-{i}")
        for variant in variants:
            key = (variant, layer)
            if key not in mean.droplevel("block").index:
                continue
            m, s = mean.loc[key].reindex(blocks), std.loc[key].reindex(blocks)
            color = colors[variant]
            for panel, name in ((top, "sink_mass"), (bottom, "sink_excess")):
                if panel is None:
                    continue
                (line,) = panel.plot(blocks, m[name].to_numpy(), "o-", color=color, lw=1.5, ms=3)
                line.set_gid(f"{name.replace('_', '-')}-{variant}-{label}")
                if runs >= 2:
                    low, high = (m[name] - s[name]).to_numpy(), (m[name] + s[name]).to_numpy()
                    band = panel.fill_between(blocks, low, high, color=color, alpha=0.18, lw=0)
                    band.set_gid(f"spread-{name.replace('_', '-')}-{variant}-{label}")
            (line,) = top.plot(blocks, m["sink_uniform"].to_numpy(), color=color, lw=1.1, ls=(0, (4, 2)))
            line.set_gid(f"uniform-{variant}-{label}")
        top.set_title(f"{label} · mass", fontsize=9.5, fontweight="bold")
        top.set_ylim(bottom=0)
        if bottom is not None:
            bottom.axhline(0, color=UNIFORM_COLOR, lw=0.9, ls=(0, (4, 2)))
            bottom.set_title(f"{label} · excess over uniform", fontsize=9.5)
        for panel in (top, bottom):
            if panel is not None:
                panel.set_xlim(blocks[0] - 0.5, blocks[-1] + 0.5)
                set_label_ticks(panel, [str(b) for b in range(blocks[-1] + 1)], length=3.0)
                panel.set_xlim(blocks[0] - 0.5, blocks[-1] + 0.5)
    if not given:
        tops = [top for top, _ in pairs]
        bottoms = [bottom for _, bottom in pairs]
        share_y(tops)
        share_y(bottoms)
        for top in tops:
            top.set_ylim(bottom=0)
        for panel in tops + bottoms:
            spec = panel.get_subplotspec()
            panel.set_ylabel(("mass" if panel in tops else "mass − uniform") if spec.is_first_col() else "")
            last_group = spec.rowspan.start // 2 == (len(shown) - 1 - spec.colspan.start) // ncols
            panel.set_xlabel("block" if panel in bottoms and last_group else "")
    sinks = rows.groupby("variant", observed=True)["sink_frames"].first()
    what = "frame 0" if set(sinks.astype(str)) <= {"0"} else "the sink frames (frame 0 without a sink policy)"
    same = sinks.astype(str).nunique() <= 1
    handles = [
        line_handle(colors[v], line_label(v, str(sinks.get(v, "0")), len(variants), same), marker="o", ms=3)
        for v in variants
    ]
    handles.append(
        line_handle("0.3", "uniform over the key tokens seen (mass panels, per variant)", lw=1.1, ls=(0, (4, 2)))
    )
    # The band's swatch in the colour the bands are drawn in (grey is the blocks without a value).
    band = "±1 std between runs" + (" (a band in the variant's colour)" if len(variants) > 1 else "")
    handles += [band_handle(colors[variants[0]], band)] if runs >= 2 and variants else []
    handles += (
        [Patch(facecolor=GAP_COLOR, label=f"none of {what.split(' (')[0]} in the cache: no value")] if empty else []
    )
    if given:
        ax.set_xlabel("block")
        ax.set_ylabel("mass")
        ax.legend(handles=handles, fontsize=8)
        return fig
    picked = "" if len(shown) == len(layers) else f" ({len(shown)} of {len(layers)} layers, spread evenly)"
    return finish(
        fig,
        title=f"Softmax mass on {what.split(' (')[0]}, block by block: as mass and as excess over uniform{picked}",
        subtitle=subtitle(source, call, "block_stats sink_mass", runs, "bands ±1 std between runs"),
        legend=handles,
        caption=(
            f"Upper panels: the softmax mass of each block's queries on {what} outside the block (block_stats "
            "sink_mass), solid, and the mass uniform attention over the key tokens would give them (sink_uniform, "
            "dashed: it falls as frames accumulate, so a falling mass alone is no fading preference). Lower "
            "panels: the excess, mass − uniform (sink_excess; 0 = no preference). Mean over heads and runs"
            + ("; bands: ±1 std between runs of the head means" if runs >= 2 else f" ({runs} run: no spread)")
            + ". Shaded blocks have none of those frames in their cache (block 0 has no cache): no value, no "
            "point."
        ),
    )
