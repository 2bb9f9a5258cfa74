"""Which heads does the video depend on? For each sweep of heads (``heads: each``), a
layer x head map of the drift that editing that head alone gives the video
(head_atlas ``drift_last_block``: the mean latent distance to the untouched video over the
last block's frames), the untouched run's sink-class heads outlined (dashed: ``sink?``);
beside it, every head's drift against its untouched frame-0 mass (``frame0_mass_default``):
does the attention pattern predict the causal effect? A sweep of layers (``heads:
each:layer``) is a one-column map. The numbers are the run-averaged rows (prompt_id '*'),
bars ±1 std between runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from sinkscope.figures.colours import CLASS_COLORS, cell_size, colour_scale, colourbar, heat, scale_sentence
from sinkscope.figures.layout import finish, new_figure, set_label_ticks
from sinkscope.figures.marks import spread_handle
from sinkscope.figures.text import significant, spread_note, subtitle
from sinkscope.figures.views import one_checkpoint, run_averaged, table
from sinkscope.naming import head_label, layer_label
from sinkscope.stats.summaries import rank_correlation
from sinkscope.tables import RUN_STD_SUFFIX

DRIFT = "drift_last_block"
MASS = "frame0_mass_default"
SINK_EDGE = "black"
OTHER_COLOR = "0.55"
MOST_NAMED = 5  # heads of most drift named in the caption, per sweep
SCATTER_WIDTH = 3.8  # inches


def class_of(value: Any) -> str | None:
    return str(value) if isinstance(value, str) and value else None


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "head_atlas"
    rows = run_averaged(table(tables, kind, kind), kind)
    one_checkpoint(rows, kind)
    # Sweeps of heads first, then of layers (head -1), each in the table's order.
    sweeps = sorted(
        (str(s) for s in pd.unique(rows["sweep"])), key=lambda s: bool((rows.loc[rows["sweep"] == s, "head"] < 0).all())
    )
    runs = int(rows["runs"].max())
    layers = sorted(int(x) for x in rows["layer"].unique())
    by_sweep = {s: rows[rows["sweep"] == s] for s in sweeps}
    heads_of = {s: sorted(int(h) for h in by_sweep[s]["head"].unique()) for s in sweeps}
    widest = max(len(h) for h in heads_of.values())
    values = rows[DRIFT].to_numpy(dtype=float)
    cmap, norm = colour_scale(values, "prob_mass")
    cell = cell_size(len(layers), widest, largest=0.42, smallest=0.16, budget=7)
    given = ax is not None
    if given:
        if len(sweeps) != 1:
            raise ValueError(f"{kind} draws into one axes only for one sweep (sweeps=[...])")
        fig, pairs = ax.figure, [(ax, None)]
    else:
        map_width = max(2.0, widest * cell + 1.0)
        height = max(2.6, len(layers) * cell + 1.0)
        fig = new_figure(map_width + SCATTER_WIDTH + 1.4, height * len(sweeps))
        grid = fig.subplots(len(sweeps), 2, squeeze=False, width_ratios=[map_width, SCATTER_WIDTH])
        pairs = [(grid[i, 0], grid[i, 1]) for i in range(len(sweeps))]
    image, correlations, named, outlined = None, {}, {}, {}
    for (left, right), sweep in zip(pairs, sweeps):
        part = by_sweep[sweep]
        heads = heads_of[sweep]
        every_head = heads == [-1]
        cells = part.set_index(["layer", "head"])
        matrix = np.full((len(layers), len(heads)), np.nan)
        for (layer, head), value in cells[DRIFT].items():
            matrix[layers.index(int(layer)), heads.index(int(head))] = float(value)
        image = heat(left, matrix, cmap, norm)
        outlined[sweep] = 0
        for (layer, head), label in cells["head_class"].items():
            label = class_of(label)
            if label not in ("sink", "sink?"):
                continue
            i, j = layers.index(int(layer)), heads.index(int(head))
            box = Rectangle(
                (j - 0.5, i - 0.5),
                1,
                1,
                fill=False,
                edgecolor=SINK_EDGE,
                lw=1.6,
                ls="-" if label == "sink" else (0, (2, 1.5)),
                zorder=4,
            )
            box.set_gid(f"sink-{sweep}-{head_label(int(layer), int(head))}")
            left.add_patch(box)
            outlined[sweep] += 1
        left.set_title(f"{sweep}: drift at the last block", fontsize=9)
        set_label_ticks(left, ["every head"] if every_head else [f"H{h + 1}" for h in heads], length=len(heads) * cell)
        set_label_ticks(left, [layer_label(layer) for layer in layers], axis="y", length=len(layers) * cell)
        left.set_xlabel("head")
        left.set_ylabel("layer")
        x = part[MASS].to_numpy(dtype=float)
        y = part[DRIFT].to_numpy(dtype=float)
        correlations[sweep] = rank_correlation(x, y)
        order = part.sort_values(DRIFT, ascending=False, kind="stable").head(MOST_NAMED)
        named[sweep] = [
            (
                layer_label(int(r.layer)) if int(r.head) < 0 else head_label(int(r.layer), int(r.head)),
                float(getattr(r, DRIFT)),
                class_of(r.head_class),
            )
            for r in order.itertuples(index=False)
        ]
        if right is None:
            continue
        labels = [class_of(v) for v in part["head_class"]]
        colours = [CLASS_COLORS.get((label or "").rstrip("?"), OTHER_COLOR) for label in labels]
        if runs >= 2:
            xs, ys = part.get(MASS + RUN_STD_SUFFIX), part.get(DRIFT + RUN_STD_SUFFIX)
            bars = right.errorbar(
                x,
                y,
                xerr=None if xs is None else xs.to_numpy(dtype=float),
                yerr=None if ys is None else ys.to_numpy(dtype=float),
                fmt="none",
                ecolor="0.7",
                elinewidth=0.6,
                zorder=2,
            )
            for child in bars.get_children():
                child.set_gid(f"spread-{sweep}")
        hollow = [label is not None and label.endswith("?") for label in labels]
        points = right.scatter(
            x,
            y,
            s=18 if len(part) > 100 else 26,
            c=["none" if h else c for h, c in zip(hollow, colours)],
            edgecolors=colours,
            linewidths=0.9,
            zorder=3,
        )
        points.set_gid(f"heads-{sweep}")
        rho = correlations[sweep]
        right.set_title(f"{sweep}: ρ = {significant(rho, 2)} (Spearman)", fontsize=9)
        right.set_xlabel("untouched frame-0 mass")
        right.set_ylabel("drift at the last block")
        for values, limits in ((x, right.set_xlim), (y, right.set_ylim)):
            finite = values[np.isfinite(values)]
            lo = min(0.0, float(finite.min())) if finite.size else 0.0
            hi = float(finite.max()) if finite.size else 1.0
            pad = 0.06 * ((hi - lo) or 1.0)  # zero off the corner: the axes' 0 labels stay apart
            limits(lo - pad, hi + pad)
    if image is not None:
        colourbar(
            fig,
            image,
            values,
            "drift at the last block\n(mean ‖x − x_default‖ / ‖x_default‖)",
            fontsize=8.5,
            ax=[left for left, _ in pairs],
            pad=0.02,
            shrink=min(1.0, max(0.5, 8 / max(len(layers), 1))),
        )
    if given:
        ax.set_title(f"drift at the last block (head_atlas) · {sweeps[0]} · {source}", fontsize=9)
        return fig
    present = {class_of(v) for v in rows["head_class"]}
    legend = [Patch(facecolor="none", edgecolor=SINK_EDGE, lw=1.6, label="sink-class head (map)")]
    if "sink?" in present:
        legend.append(Patch(facecolor="none", edgecolor=SINK_EDGE, lw=1.6, ls=(0, (2, 1.5)), label="sink? (map)"))
    for label in ("sink", "local", "periodic", "diffuse"):
        if label in present or f"{label}?" in present:
            legend.append(
                Line2D([], [], ls="none", marker="o", ms=5, color=CLASS_COLORS[label], label=f"{label} (scatter)")
            )
    if any(v is None for v in present):
        legend.append(Line2D([], [], ls="none", marker="o", ms=5, color=OTHER_COLOR, label="no class"))
    if any(v is not None and v.endswith("?") for v in present):
        legend.append(
            Line2D([], [], ls="none", marker="o", ms=5, mfc="none", color="0.3", label="hollow: borderline (?)")
        )
    legend += [spread_handle("±1 std between runs (scatter)")] if runs >= 2 else []
    spread = spread_note(
        rows[DRIFT + RUN_STD_SUFFIX].to_numpy(dtype=float) if DRIFT + RUN_STD_SUFFIX in rows else [], runs, "a cell"
    )
    most = "; ".join(
        f"{sweep}: "
        + ", ".join(f"{name} {significant(value)}" + (f" ({label})" if label else "") for name, value, label in items)
        for sweep, items in named.items()
    )
    counted = ", ".join(f"{sweep} {outlined[sweep]}" for sweep in sweeps)
    return finish(
        fig,
        title="Head atlas: how far editing one head moves the video, against its attention to frame 0",
        subtitle=subtitle(source, "final latents, last block", "head_atlas drift_last_block", runs, "±1 std bars"),
        legend=legend,
        caption=(
            "Left: for each head (a sweep over layers: each layer, every head at once), the run that edits it alone "
            "(the sweep's template) against the untouched (default) run of the same checkpoint, prompt and seed: "
            "the mean over the last block's latent frames of ‖x − x_default‖ / ‖x_default‖ (head_atlas "
            "drift_last_block; 0 = the untouched video), averaged over runs (rows with prompt_id '*'). Outlined: "
            f"heads the untouched run classes sink (dashed: sink?), per sweep {counted}. Right: the same drift "
            "against the head's untouched softmax mass on frame 0 over its calls after block 0 "
            "(frame0_mass_default); ρ is Spearman's rank correlation over the heads: near 1, the attention "
            "pattern ranks heads as their causal effect does. Most drift: "
            f"{most}. {scale_sentence(norm)} Spread: {spread}."
        ),
    )
