"""Which cached frames does the video depend on? For each sweep of cached frames
(``key_frames: each``), the drift that editing that frame alone gives the video, one bar
per frame (frame_atlas ``drift_last_block``: the mean latent distance to the untouched
video over the last block's frames; the dots: over the blocks after the frame's own,
``drift_after_frame``), the policy's sink frames in their own colour; below, the untouched
run's softmax mass on each frame (``frame_mass_default``): does the attention a frame
receives predict what the video loses without it? The numbers are the run-averaged rows
(prompt_id '*'), bars ±1 std between runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from sinkscope.figures.colours import CLASS_COLORS, PANEL_COLORS
from sinkscope.figures.layout import finish, new_figure, set_frame_ticks
from sinkscope.figures.marks import error_bars, spread_handle
from sinkscope.figures.style import option
from sinkscope.figures.text import frames_text, significant, subtitle
from sinkscope.figures.views import one_checkpoint, run_averaged, table
from sinkscope.stats.summaries import rank_correlation
from sinkscope.tables import RUN_STD_SUFFIX

DRIFT = "drift_last_block"
AFTER = "drift_after_frame"
MASS = "frame_mass_default"
FRAME_COLOR = PANEL_COLORS[0]
SINK_COLOR = CLASS_COLORS["sink"]
AFTER_COLOR = "0.15"


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "frame_atlas"
    rows = run_averaged(table(tables, kind, kind), kind)
    one_checkpoint(rows, kind)
    base = int(option(options, "frame_base"))
    sweeps = [str(s) for s in pd.unique(rows["sweep"])]
    runs = int(rows["runs"].max())
    frames = sorted(int(f) for f in rows["key_frame"].unique())
    given = ax is not None
    if given:
        if len(sweeps) != 1:
            raise ValueError(f"{kind} draws into one axes only for one sweep (sweeps=[...])")
        fig, pairs = ax.figure, [(ax, None)]
    else:
        fig = new_figure(max(6.0, min(14.0, 2.5 + 0.3 * len(frames))), 4.4 * len(sweeps))
        grid = fig.subplots(2 * len(sweeps), 1, squeeze=False, height_ratios=[3, 2] * len(sweeps))
        pairs = [(grid[2 * i, 0], grid[2 * i + 1, 0]) for i in range(len(sweeps))]
    notes = []
    for (top, bottom), sweep in zip(pairs, sweeps):
        part = rows[rows["sweep"] == sweep].sort_values("key_frame")
        x = part["key_frame"].to_numpy(dtype=int)
        sink = part["sink"].astype(bool).to_numpy()
        colours = [SINK_COLOR if s else FRAME_COLOR for s in sink]
        for frame, bar in zip(x, top.bar(x, part[DRIFT].to_numpy(dtype=float), color=colours, width=0.8, zorder=2)):
            bar.set_gid(f"drift-{sweep}-f{frame}")
        if runs >= 2:
            error_bars(top, x, part[DRIFT], part.get(DRIFT + RUN_STD_SUFFIX), gid=f"drift-{sweep}")
        (dots,) = top.plot(x, part[AFTER].to_numpy(dtype=float), "o", color=AFTER_COLOR, ms=3.5, zorder=4)
        dots.set_gid(f"drift-after-frame-{sweep}")
        top.set_ylim(bottom=0)
        top.set_title(f"{sweep}: drift of the video when one cached frame is edited", fontsize=9.5)
        top.set_ylabel("drift at the last block")
        worst = part.loc[part[DRIFT].idxmax()] if part[DRIFT].notna().any() else None
        if worst is not None:
            notes.append(
                f"{sweep}: most drift at frame {int(worst['key_frame']) + base} ({significant(float(worst[DRIFT]))}"
                f"{', a sink frame' if bool(worst['sink']) else ''})"
            )
        if bottom is not None:
            masses = bottom.bar(x, part[MASS].to_numpy(dtype=float), color=colours, width=0.8, alpha=0.55, zorder=2)
            for frame, bar in zip(x, masses):
                bar.set_gid(f"mass-{sweep}-f{frame}")
            if runs >= 2:
                error_bars(bottom, x, part[MASS], part.get(MASS + RUN_STD_SUFFIX), gid=f"mass-{sweep}")
            bottom.set_ylim(bottom=0)
            bottom.set_ylabel("untouched mass")
            bottom.set_title("the untouched run's softmax mass on the frame", fontsize=9)
            rho = rank_correlation(part[DRIFT], part[MASS])
            if np.isfinite(rho):
                notes[-1] += f", Spearman ρ between drift and untouched mass {significant(rho, 2)}"
        for panel in (top, bottom):
            if panel is None:
                continue
            panel.set_xlim(frames[0] - 0.6, frames[-1] + 0.6)
            set_frame_ticks(panel, frames, base, length=fig.get_size_inches()[0] - 1.5)
            panel.set_xlabel("edited cached frame (latent)")
    if given:
        ax.set_title(f"drift at the last block (frame_atlas) · {sweeps[0]} · {source}", fontsize=9)
        return fig
    sinks = sorted(int(f) for f in rows.loc[rows["sink"].astype(bool), "key_frame"].unique())
    legend = [
        Patch(facecolor=FRAME_COLOR, label="frame"),
        Patch(facecolor=SINK_COLOR, label=f"sink frame ({frames_text(sinks, base)})" if sinks else "sink frame"),
        Line2D([], [], ls="none", marker="o", ms=4, color=AFTER_COLOR, label="drift after the frame's block"),
    ]
    legend += [spread_handle()] if runs >= 2 else []
    return finish(
        fig,
        title="Frame atlas: how far editing one cached frame moves the video, against the attention it gets",
        subtitle=subtitle(source, "final latents, last block", "frame_atlas drift_last_block", runs, "±1 std bars"),
        legend=legend,
        caption=(
            "Upper panel of each sweep: for each cached frame, the run that edits it alone (the sweep's template) "
            "against the untouched (default) run of the same checkpoint, prompt and seed: bars, the mean over the "
            "last block's latent frames of ‖x − x_default‖ / ‖x_default‖ (frame_atlas drift_last_block); dots, the "
            "same over the blocks after the frame's own (drift_after_frame), where the edit can act. Lower panel: "
            "the untouched run's mean softmax mass on the frame over every captured head and every later call "
            "that holds it (frame_mass_default). Mean over runs (rows with prompt_id '*')"
            + ("; bars ±1 std between runs" if runs >= 2 else f" ({runs} run: no spread)")
            + ". "
            + "; ".join(notes)
            + "."
        ),
    )
