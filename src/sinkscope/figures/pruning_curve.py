"""Does the head atlas rank heads better than their attention pattern does? For each
pruning sweep (``over: atlas:<head sweep>``), the drift at the last block
(pruning_curve ``drift_last_block``) of editing the first k heads against k, three
lines: the heads of least atlas drift first, a seeded random order (the control), and
the heads of least untouched frame-0 mass first (the attention-pattern rule the
cache-pruning papers use); k = 0 is the untouched video (0), and every head of the atlas
is one run all three lines share. The numbers are the run-averaged rows (prompt_id '*'),
bands ±1 std between runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from sinkscope.figures.colours import PANEL_COLORS
from sinkscope.figures.layout import finish, panels
from sinkscope.figures.marks import band_handle, line_handle
from sinkscope.figures.text import significant, subtitle
from sinkscope.figures.views import one_checkpoint, run_averaged, table
from sinkscope.tables import RUN_STD_SUFFIX

DRIFT = "drift_last_block"
# The orders, in the words the figure uses.
ORDERS = {
    "drift": "least atlas drift first",
    "random": "random order (control)",
    "frame0_mass": "least frame-0 mass first",
}
COLORS = {"drift": PANEL_COLORS[0], "random": "0.45", "frame0_mass": PANEL_COLORS[2]}
EVERY = "all"


def curve(rows: pd.DataFrame, order: str) -> pd.DataFrame:
    """One order's points, k ascending, from (0, 0) to the shared every-head run."""
    own = rows[rows["order"].isin([order, EVERY])].sort_values("head_count")
    start = pd.DataFrame({"head_count": [0], DRIFT: [0.0], DRIFT + RUN_STD_SUFFIX: [0.0]})
    return pd.concat([start, own[["head_count", DRIFT, DRIFT + RUN_STD_SUFFIX]]], ignore_index=True)


def area(points: pd.DataFrame) -> float:
    """The area under the curve over k / (largest k): the mean drift over the grid (trapezoids)."""
    k = points["head_count"].to_numpy(dtype=float)
    y = points[DRIFT].to_numpy(dtype=float)
    if len(k) < 2 or not np.isfinite(y).all() or k[-1] <= 0:
        return float("nan")
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(k)) / k[-1])


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "pruning_curve"
    rows = run_averaged(table(tables, kind, kind), kind)
    one_checkpoint(rows, kind)
    sweeps = [str(s) for s in pd.unique(rows["sweep"])]
    runs = int(rows["runs"].max())
    ncols = min(3, len(sweeps))
    fig, axes = panels(
        ax, len(sweeps), kind=kind, one="sweep (sweeps=[...])", ncols=ncols, panel=(6.0, 3.8), extra=(1.4, 0.2)
    )
    summaries = []
    for panel, sweep in zip(axes, sweeps):
        part = rows[rows["sweep"] == sweep]
        areas = {}
        for order, words in ORDERS.items():
            points = curve(part, order)
            if len(points) < 2:
                continue
            k = points["head_count"].to_numpy(dtype=float)
            y = points[DRIFT].to_numpy(dtype=float)
            (line,) = panel.plot(k, y, "o-", color=COLORS[order], lw=1.6, ms=3, label=words, zorder=3)
            line.set_gid(f"{sweep}-{order}")
            spread = points[DRIFT + RUN_STD_SUFFIX].to_numpy(dtype=float)
            if runs >= 2 and np.isfinite(spread[1:]).any():
                band = panel.fill_between(
                    k, y - np.nan_to_num(spread), y + np.nan_to_num(spread), color=COLORS[order], alpha=0.16, lw=0
                )
                band.set_gid(f"spread-{sweep}-{order}")
            areas[order] = area(points)
        panel.axhline(0, color="0.2", lw=0.8, zorder=1)
        panel.set_xlim(left=0)
        panel.set_ylim(bottom=min(0.0, panel.get_ylim()[0]))
        total = int(part["head_count"].max())
        panel.set_title(f"{sweep} (k up to {total} heads)", fontsize=9.5)
        panel.set_xlabel("heads edited (k)")
        panel.set_ylabel("drift at the last block")
        if areas:
            summaries.append(f"{sweep}: " + ", ".join(f"{o} {significant(a)}" for o, a in areas.items()))
    if ax is not None:
        ax.set_title(f"drift at the last block against k (pruning_curve) · {sweeps[0]} · {source}", fontsize=9)
        return fig
    handles = [line_handle(COLORS[order], words, marker="o", ms=3) for order, words in ORDERS.items()]
    handles += [band_handle("0.5", "±1 std between runs (each line's colour)")] if runs >= 2 else []
    return finish(
        fig,
        title="Pruning curve: editing the k heads the atlas ranks harmless, against two controls",
        subtitle=subtitle(source, "final latents, last block", "pruning_curve drift_last_block", runs, "bands ±1 std"),
        legend=handles,
        caption=(
            "For each head count k, the run that applies the sweep's edit to the first k heads of an order of the "
            "head atlas, against the untouched (default) run of the same checkpoint, prompt and seed: the mean "
            "over the last block's latent frames of ‖x − x_default‖ / ‖x_default‖ (pruning_curve drift_last_block), "
            "averaged over runs (rows with prompt_id '*')"
            + ("; bands ±1 std between runs" if runs >= 2 else f" ({runs} run: no spread)")
            + ". k = 0 is the untouched video; at every head the orders agree (one run). A lower line finds heads "
            "the video needs less. The atlas is ranked on single-head runs of the same seeds (in sample); masking "
            "k heads at once it did not see. Area under each curve over the largest k: " + "; ".join(summaries) + "."
        ),
    )
