"""How far does each edited variant's video move away from the untouched one, frame by
frame? The latent L2 distance of each latent frame to the same frame of the untouched
(``default``) video over that frame's norm (variant_effects ``latent_rel_distance``), one
line per variant over the latent frames both videos have, with a ±1 std band between
runs (prompts x seeds); below, the drift proxy: each frame's cosine to frame 0 of its own
video (``first_frame_similarity``) beside the untouched video's. Block boundaries are
marked; block 0, which no edit touches (it has no cache), is shaded. The numbers are the
run-averaged rows (prompt_id '*') of the table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from matplotlib import colors as mcolors
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from sinkscope.figures.colours import GAP_COLOR, VARIANT_COLORS
from sinkscope.figures.layout import finish, new_figure, set_frame_ticks
from sinkscope.figures.marks import band_handle, line_handle
from sinkscope.figures.style import option
from sinkscope.figures.text import subtitle
from sinkscope.figures.views import one_checkpoint, run_averaged, table, variants_in, without_atlas_runs
from sinkscope.tables import RUN_STD_SUFFIX

DISTANCE = "latent_rel_distance"
SIMILARITY = "first_frame_similarity"
BOUNDARY_COLOR = "0.45"
DEFAULT_COLOR = "0.15"
BAND_ALPHA = 0.18
DEFAULT_BAND_ALPHA = 0.12
# The untouched video's band is grey like block 0's shading: dashed edges tell it apart.
DEFAULT_BAND_EDGE = {"edgecolor": DEFAULT_COLOR, "linestyle": (0, (2, 2)), "linewidth": 0.6}


def boundaries(blocks: pd.Series) -> list[int]:
    """The first frame of every block but block 0 (rows indexed by latent frame)."""
    values = blocks.sort_index()
    change = values.to_numpy()[1:] != values.to_numpy()[:-1]
    return [int(f) for f in values.index[1:][change]]


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "variant_drift"
    rows = without_atlas_runs(table(tables, "variant_effects", kind))
    one_checkpoint(rows, kind)
    base = int(option(options, "frame_base"))
    rows = run_averaged(rows, kind)
    variants = [v for v in variants_in(rows) if v != "default"]
    runs = int(rows["runs"].max())
    colors = {v: VARIANT_COLORS[i % len(VARIANT_COLORS)] for i, v in enumerate(variants)}
    frames = sorted(int(f) for f in rows["latent_frame"].unique())
    given = ax is not None
    if given:
        fig, top, bottom = ax.figure, ax, None
    else:
        fig = new_figure(max(6.0, min(14.0, 2.5 + 0.22 * len(frames))), 5.4)
        top, bottom = fig.subplots(2, 1, height_ratios=[3, 2])
    by_variant = {v: g.set_index("latent_frame").sort_index() for v, g in rows.groupby("variant", observed=True)}
    first = by_variant[variants[0]] if variants else None
    shared = boundaries(first["block"]) if first is not None else []
    block0 = [f for f in frames if first is not None and f in first.index and int(first.loc[f, "block"]) == 0]
    panels = [p for p in (top, bottom) if p is not None]
    for panel in panels:
        if block0:
            panel.axvspan(min(block0) - 0.5, max(block0) + 0.5, color=GAP_COLOR, lw=0, zorder=0.3).set_gid("block-0")
        for i, f in enumerate(shared):
            panel.axvline(f - 0.5, color=BOUNDARY_COLOR, lw=0.8, ls=(0, (2, 2)), zorder=0.5).set_gid(
                f"block-boundary-{i}"
            )
    own_boundaries = {}
    for variant in variants:
        part = by_variant[variant]
        x = part.index.to_numpy()
        color = colors[variant]
        own = [f for f in boundaries(part["block"]) if f not in shared]
        own_boundaries[variant] = own
        for panel in panels:
            for i, f in enumerate(own):
                panel.axvline(f - 0.5, color=color, lw=0.8, ls=(0, (2, 2)), zorder=0.5).set_gid(
                    f"block-boundary-{variant}-{i}"
                )
        for panel, name in ((top, DISTANCE), (bottom, SIMILARITY)):
            if panel is None:
                continue
            (line,) = panel.plot(x, part[name].to_numpy(), "o-", color=color, lw=1.5, ms=2.5)
            line.set_gid(f"{name.replace('_', '-')}-{variant}")
            spread = part.get(name + RUN_STD_SUFFIX)
            # Bands for the distance; below, the untouched video's band only (the variants'
            # curves lie close to it, and their bands would hide each other).
            if panel is top and runs >= 2 and spread is not None and spread.notna().any():
                band = panel.fill_between(
                    x,
                    (part[name] - spread).to_numpy(),
                    (part[name] + spread).to_numpy(),
                    color=color,
                    alpha=BAND_ALPHA,
                    lw=0,
                )
                band.set_gid(f"spread-{name.replace('_', '-')}-{variant}")
    if bottom is not None and first is not None:
        # The untouched video's own drift proxy: one curve (it is the same for every variant's pairing).
        reference = first["first_frame_similarity_default"]
        x = reference.index.to_numpy()
        (line,) = bottom.plot(x, reference.to_numpy(), color=DEFAULT_COLOR, lw=1.2, ls=(0, (4, 2)), zorder=3)
        line.set_gid("first-frame-similarity-default")
        spread = first.get("first_frame_similarity_default" + RUN_STD_SUFFIX)
        if runs >= 2 and spread is not None and spread.notna().any():
            band = bottom.fill_between(
                x,
                (reference - spread).to_numpy(),
                (reference + spread).to_numpy(),
                facecolor=mcolors.to_rgba(DEFAULT_COLOR, DEFAULT_BAND_ALPHA),
                **DEFAULT_BAND_EDGE,
            )
            band.set_gid("spread-first-frame-similarity-default")
    top.axhline(0, color=DEFAULT_COLOR, lw=0.8, zorder=0.6)
    top.set_ylim(bottom=min(0.0, top.get_ylim()[0]))
    for panel in panels:
        panel.set_xlim(frames[0] - 0.5, frames[-1] + 0.5)
        # Ticks that do not depend on the panel's final height (an auto locator can switch
        # steps between the layout passes and the last draw, moving the axis label).
        panel.yaxis.set_major_locator(MaxNLocator(nbins=5))
    for panel in panels:
        set_frame_ticks(panel, frames, base, length=fig.get_size_inches()[0] - 1.5)
    panels[-1].set_xlabel("latent frame")
    top.set_ylabel("‖x − x_default‖ / ‖x_default‖")
    distance_words = "latent distance to the untouched video (latent_rel_distance)"
    if given:
        top.set_title(f"{distance_words} · {source}", fontsize=9)
        return fig
    top.set_title("distance to the untouched video, per latent frame", fontsize=9.5, fontweight="bold")
    bottom.set_ylabel("cosine to frame 0")
    bottom.set_title("drift proxy: each frame's cosine to frame 0 of its own video", fontsize=9.5)
    handles = [line_handle(colors[v], v, marker="o", ms=3) for v in variants]
    handles.append(line_handle(DEFAULT_COLOR, "default (untouched), lower panel", lw=1.2, ls=(0, (4, 2))))
    if runs >= 2 and variants:
        # Each swatch in its band's colour: the upper bands in their variant's, the lower one grey.
        handles.append(
            band_handle(
                colors[variants[0]], "±1 std between runs, upper panel (the variant's colour)", alpha=BAND_ALPHA
            )
        )
        handles.append(
            Patch(
                facecolor=mcolors.to_rgba(DEFAULT_COLOR, DEFAULT_BAND_ALPHA),
                label="±1 std between runs of default, lower panel",
                **DEFAULT_BAND_EDGE,
            )
        )
    handles.append(line_handle(BOUNDARY_COLOR, "block boundary", lw=0.8, ls=(0, (2, 2))))
    handles += [Patch(facecolor=GAP_COLOR, label="block 0: no cache, no edit")] if block0 else []
    differing = [v for v, own in own_boundaries.items() if own]
    shared_frames = (
        "the frames both videos have"
        if rows.groupby("variant", observed=True)["latent_frame"].max().nunique() <= 1
        else "the frames each variant's video shares with the untouched one"
    )
    worst = rows.loc[rows[DISTANCE].idxmax()] if rows[DISTANCE].notna().any() else None
    largest = (
        (
            f" Largest mean distance: {float(worst[DISTANCE]):.3g} ({worst['variant']}, frame "
            f"{int(worst['latent_frame']) + base})."
        )
        if worst is not None
        else ""
    )
    return finish(
        fig,
        title="Edited variants against the untouched video: latent distance and drift, frame by frame",
        subtitle=subtitle(
            source, "final latents", "variant_effects latent_rel_distance", runs, "bands ±1 std between runs"
        ),
        legend=handles,
        caption=(
            "Upper panel: for each latent frame, the L2 distance between the variant's final latents and the "
            "untouched (default) run's of the same checkpoint, prompt and seed, over the untouched frame's norm "
            f"(variant_effects latent_rel_distance; 0 = the same frame), over {shared_frames}. Lower panel: each "
            "frame's cosine to frame 0 of its own video (first_frame_similarity), dashed for the untouched video "
            "(first_frame_similarity_default): a variant below it drifts further from its first frame. Mean over "
            "runs (the rows with prompt_id '*')"
            + (
                "; bands: ±1 std between runs (lower panel: of the untouched video's curve)"
                if runs >= 2
                else f" ({runs} run: no spread)"
            )
            + ". Dotted lines: block boundaries"
            + (
                f" (in a variant's colour where only its blocks change there: {', '.join(differing)})"
                if differing
                else ""
            )
            + ". Edits touch cached frames only, so block 0 (shaded) is the untouched video's."
            + largest
        ),
    )
