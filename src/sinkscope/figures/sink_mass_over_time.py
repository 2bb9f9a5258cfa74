"""Does the sink hold as the video grows? The softmax mass on the sink frames (block_stats
sink_mass: the policy's sink frames, frame 0 without one) block by block, averaged over
heads and runs with a ±1 std band over heads, one panel per layer (a selection of up to
twelve at many layers), one line per variant of the checkpoint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from sinkscope.figures import common as c

MOST_PANELS = 12


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "sink_mass_over_time"
    stats = c.table(tables, "block_stats", kind)
    checkpoints = sorted(str(x) for x in pd.unique(stats["checkpoint"]))
    if len(checkpoints) > 1:
        raise ValueError(f"figure {kind} draws one checkpoint; the table holds {', '.join(checkpoints)} (checkpoint=...)")
    step = options.get("step") or "last"
    rows, call = c.block_call_rows(stats, step)
    variants = c.variants_in(rows)
    layers = sorted(int(x) for x in rows["layer"].unique())
    shown = c.evenly(layers, MOST_PANELS)
    given = ax is not None
    fig, axes = c.panels(ax, len(shown), kind=kind, one="layer (layers=[...])", ncols=min(len(shown), 4), panel=(3.3, 2.4))
    colors = {v: c.PANEL_COLORS[i % len(c.PANEL_COLORS)] for i, v in enumerate(variants)}
    per_head = rows.groupby(["variant", "layer", "block", "head"], observed=True)["sink_mass"].mean()
    mean = per_head.groupby(["variant", "layer", "block"], observed=True).mean()
    std = per_head.groupby(["variant", "layer", "block"], observed=True).std(ddof=0)
    blocks = sorted(int(b) for b in rows["block"].unique())
    top = float(min(1.0, max(0.05, ((mean + std.fillna(0)).max()) * 1.12)))
    for ax_, layer in zip(axes, shown):
        for variant in variants:
            key = (variant, layer)
            if key not in mean.droplevel("block").index:
                continue
            m, s = mean.loc[key], std.loc[key]
            (line,) = ax_.plot(m.index, m.to_numpy(), "o-", color=colors[variant], lw=1.5, ms=3)
            line.set_gid(f"sink-mass-{variant}-{c.layer_label(layer)}")
            ax_.fill_between(m.index, (m - s).to_numpy(), (m + s).to_numpy(), color=colors[variant], alpha=0.15, lw=0)
        ax_.set_title(c.layer_label(layer), fontsize=9.5, fontweight="bold")
        ax_.set_ylim(0, top)
        ax_.set_xlim(blocks[0] - 0.3, blocks[-1] + 0.3)
        c.set_label_ticks(ax_, [str(b) for b in range(blocks[-1] + 1)], length=3.0)
        ax_.set_xlim(blocks[0] - 0.3, blocks[-1] + 0.3)
    c.share_y(axes)
    c.outer_labels(axes, "block", "sink mass")
    sinks = rows.groupby("variant", observed=True)["sink_frames"].first()
    handles = [c.line_handle(colors[v], f"{v} (sink frames {sinks.get(v, '0')})", marker="o", ms=3) for v in variants]
    if given:
        ax_.legend(handles=handles, fontsize=8)
        return fig
    picked = "" if len(shown) == len(layers) else f" ({len(shown)} of {len(layers)} layers, spread evenly)"
    return c.finish(
        fig,
        title=f"Mass on the sink frames, block by block{picked}",
        subtitle=c.subtitle(source, call, "sink mass (softmax)", c.run_count(rows)),
        legend=handles,
        caption=("sink_mass of block_stats: the softmax mass of the block's queries on the policy's sink frames (frame "
                 "0 for policies without sinks), the block's own frames excluded; mean over heads and runs, band ±1 "
                 "std over heads."),
    )  # fmt: skip
