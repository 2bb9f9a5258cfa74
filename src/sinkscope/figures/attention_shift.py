"""Where did each edit move the attention? For every variant of the checkpoint, a layer x
head map of the change of frame-0 mass against the untouched (``default``) run
(variant_head_effects ``frame0_mass_change``: over the calls after block 0 that both runs
make, matched by block, pass, step and query frame, the variant's softmax mass on frame 0
minus the default's), averaged over runs (the rows with prompt_id '*'); one diverging
colour scale centred on 0 shared by every panel, the heads a ``mask_keys`` or
``logit_bias`` edit of the variant names (``edited``) outlined. Only the captured layers
have rows."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.colors import SymLogNorm
from matplotlib.patches import Patch, Rectangle

from sinkscope.figures.colours import annotate_cells, cell_size, colour_scale, colourbar, heat, scale_sentence
from sinkscope.figures.layout import finish, new_figure, set_label_ticks
from sinkscope.figures.text import spread_note, subtitle
from sinkscope.figures.views import one_checkpoint, run_averaged, table, variants_in, without_atlas_runs
from sinkscope.naming import layer_label
from sinkscope.tables import RUN_STD_SUFFIX

STAT = "frame0_mass_change"
EDITED_EDGE = "black"
MOST_COLUMNS = 3
PAGE_WIDTH = 17.0  # inches the panels may take side by side


def grid_of(rows: pd.DataFrame, name: str, layers: list[int], heads: list[int]) -> np.ndarray:
    """Layers x heads of one column (NaN where a head has no row)."""
    values = rows.set_index(["layer", "head"])[name].astype(float)
    index = pd.MultiIndex.from_product([layers, heads], names=["layer", "head"])
    return values.reindex(index).to_numpy().reshape(len(layers), len(heads))


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "attention_shift"
    rows = run_averaged(without_atlas_runs(table(tables, "variant_head_effects", kind)), kind)
    one_checkpoint(rows, kind)
    variants = [v for v in variants_in(rows) if v != "default"]
    layers = sorted(int(x) for x in rows["layer"].unique())
    heads = sorted(int(x) for x in rows["head"].unique())
    runs = int(rows["runs"].max())
    by_variant = {v: rows[rows["variant"] == v] for v in variants}
    grids = {v: grid_of(by_variant[v], STAT, layers, heads) for v in variants}
    values = np.concatenate([g.ravel() for g in grids.values()]) if grids else np.array([np.nan])
    cmap, norm = colour_scale(values, "signed")
    cell = cell_size(len(layers), len(heads), largest=0.42, smallest=0.16, budget=7)
    given = ax is not None
    if given:
        if len(variants) != 1:
            raise ValueError(f"{kind} draws into one axes only for one variant (variants=[...])")
        fig, axes = ax.figure, [ax]
    else:
        width = max(2.2, len(heads) * cell + 0.9)
        height = max(1.6, len(layers) * cell + 0.8)
        ncols = max(1, min(MOST_COLUMNS, len(variants), int(PAGE_WIDTH // width)))
        nrows = math.ceil(len(variants) / ncols)
        fig = new_figure(max(6.0, ncols * width + 1.6), nrows * height)
        grid = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
        for extra in grid[len(variants) :]:
            extra.remove()
        axes = grid[: len(variants)]
    image = None
    edited_counts = {}
    for panel, variant in zip(axes, variants):
        matrix = grids[variant]
        image = heat(panel, matrix, cmap, norm)
        if cell >= 0.4 and matrix.size <= 150:
            annotate_cells(panel, matrix, ".2g", norm, cmap, fontsize=6)
        edited = by_variant[variant].loc[by_variant[variant]["edited"].astype(bool), ["layer", "head"]]
        edited_counts[variant] = len(edited)
        # Every head edited: one outline around the map says it without a box per cell.
        if len(edited) == len(layers) * len(heads) and len(edited):
            box = Rectangle((-0.5, -0.5), len(heads), len(layers), fill=False, edgecolor=EDITED_EDGE, lw=2.0, zorder=4)
            box.set_gid(f"edited-all-{variant}")
            panel.add_patch(box)
        else:
            for layer, head in edited.itertuples(index=False):
                i, j = layers.index(int(layer)), heads.index(int(head))
                box = Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor=EDITED_EDGE, lw=1.6, zorder=4)
                box.set_gid(f"edited-{variant}-L{int(layer) + 1}H{int(head) + 1}")
                panel.add_patch(box)
        panel.set_title(f"{variant} ({len(edited)} edited head{'s' if len(edited) != 1 else ''})", fontsize=9)
        set_label_ticks(panel, [f"H{h + 1}" for h in heads], length=len(heads) * cell)
        set_label_ticks(panel, [layer_label(layer) for layer in layers], axis="y", length=len(layers) * cell)
        spec = panel.get_subplotspec()
        panel.set_xlabel("head")
        panel.set_ylabel("layer" if spec is None or spec.is_first_col() else "")
    label = "change of frame-0 mass\n(variant − default)"
    if image is not None:
        bar = colourbar(
            fig,
            image,
            values,
            label,
            fontsize=8.5,
            ax=axes,
            pad=0.02,
            shrink=min(1.0, max(0.5, 8 / max(len(layers), 1))),
        )
        if isinstance(norm, SymLogNorm):
            # Decades inside the linear range crowd 0: keep 0 and the decades beyond it.
            ticks = [t for t in bar.get_ticks() if t == 0 or abs(t) >= 10 * norm.linthresh]
            bar.set_ticks([t for t in ticks if norm.vmin <= t <= norm.vmax])
    if given:
        ax.set_title(f"change of frame-0 mass (frame0_mass_change) · {variants[0]} · {source}", fontsize=9)
        return fig
    spread = spread_note(
        rows[STAT + RUN_STD_SUFFIX].to_numpy(dtype=float) if STAT + RUN_STD_SUFFIX in rows else [],
        runs,
        "a head's change",
    )
    legend = [
        Patch(
            facecolor="none",
            edgecolor=EDITED_EDGE,
            lw=1.6,
            label="edited head (named by a mask_keys / logit_bias edit; a box round the map: every head)",
        )
    ]
    finite = values[np.isfinite(values)]
    extremes = f" Changes range from {finite.min():+.3g} to {finite.max():+.3g}." if finite.size else ""
    return finish(
        fig,
        title="Change of frame-0 mass against the untouched run, every captured head",
        subtitle=subtitle(
            source, "calls after block 0", "variant_head_effects frame0_mass_change", runs, "spread in the caption"
        ),
        legend=legend,
        caption=(
            "Each cell: frame0_mass_change, the mean over the calls after block 0 that both runs make (matched "
            "by block, pass, step and query frame) of the variant's softmax mass on frame 0 minus the untouched "
            "(default) run's of the same checkpoint, prompt and seed (0 where frame 0 is not a key frame of the "
            "call); mean over runs (the rows with prompt_id '*'). Red: the variant puts more mass on frame 0; "
            "blue: less. Outlined: the heads a mask_keys or logit_bias edit of the variant names (a cache edit "
            "names none: it changes what every head reads). Only the captured layers are drawn."
            f"{extremes} {scale_sentence(norm)} Spread: {spread}."
        ),
    )
