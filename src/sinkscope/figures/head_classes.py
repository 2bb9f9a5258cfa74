"""Every layer x head coloured by its class in head_diagnostics (sink, local, periodic,
diffuse; ``summaries.head_class_grid``), with a categorical legend that counts them.
Borderline labels (``sink?``, ``local?``: the runs straddle the threshold) take their
class's colour, lighter and hatched, and are counted apart from the settled ones."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colors as mcolors
from matplotlib.patches import Patch, Rectangle

from sinkscope.figures.colours import CLASS_COLORS, cell_size
from sinkscope.figures.layout import finish, new_figure, set_label_ticks
from sinkscope.figures.text import call_label, subtitle
from sinkscope.figures.views import one_source, step_of, table
from sinkscope.stats.summaries import HEAD_LABELS, base_class, head_class_grid, is_borderline

HATCH = "////"


def label_color(label: str) -> tuple[float, float, float]:
    """The class's colour; a borderline label's halfway to white."""
    rgb = np.array(mcolors.to_rgb(CLASS_COLORS.get(base_class(label), "#888888")))
    return tuple(rgb + (1 - rgb) * 0.55) if is_borderline(label) else tuple(rgb)


def _handle(label: str, count: int) -> Patch:
    if is_borderline(label):
        return Patch(
            facecolor=label_color(label),
            edgecolor=CLASS_COLORS.get(base_class(label), "#888888"),
            lw=0.5,
            hatch=HATCH,
            label=f"{label} borderline ({count})",
        )
    return Patch(facecolor=label_color(label), edgecolor="0.5", lw=0.5, label=f"{label} ({count})")


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "head_classes"
    diagnostics = one_source(table(tables, "head_diagnostics", kind), kind)
    step = options.get("step") or "last"
    grid = head_class_grid(diagnostics, step)
    pass_, index = step_of(diagnostics, step)
    rows = diagnostics[(diagnostics["pass"] == pass_) & (diagnostics["step"] == index)]
    call = call_label(pass_, index, float(rows["timestep"].iloc[0]) if len(rows) else None)
    runs = int(rows["runs"].max()) if len(rows) else 0
    present = set(grid.stack().dropna())
    # The settled classes always (their zero counts say something); borderline labels when present.
    labels = [name for name in HEAD_LABELS if not is_borderline(name) or name in present]
    labels += sorted(present - set(labels))
    codes = grid.apply(lambda col: col.map({name: i for i, name in enumerate(labels)})).to_numpy(dtype=float)
    cell = cell_size(*codes.shape, largest=0.5, smallest=0.2, budget=10)
    given = ax is not None
    fig = (
        ax.figure if given else new_figure(max(5.0, codes.shape[1] * cell + 1.2), max(2.5, codes.shape[0] * cell + 0.9))
    )
    ax = ax if given else fig.add_subplot()
    cmap = mcolors.ListedColormap([label_color(name) for name in labels]).with_extremes(bad="white")
    image = ax.imshow(
        np.ma.masked_invalid(codes),
        cmap=cmap,
        vmin=-0.5,
        vmax=len(labels) - 0.5,
        aspect="auto",
        interpolation="nearest",
    )
    image.set_gid("head-classes")
    ax.grid(False)
    for (i, j), code in np.ndenumerate(codes):
        if np.isfinite(code) and is_borderline(labels[int(code)]):
            hatch = Rectangle(
                (j - 0.5, i - 0.5),
                1,
                1,
                fill=False,
                hatch=HATCH,
                lw=0,
                edgecolor=CLASS_COLORS.get(base_class(labels[int(code)]), "#888888"),
            )
            hatch.set_gid(f"borderline-L{i}-H{j}")
            ax.add_patch(hatch)
    # Letters in the cells too: the classes stay readable without colour ('S?' borderline).
    if cell >= 0.3:
        for (i, j), code in np.ndenumerate(codes):
            if np.isfinite(code):
                name = labels[int(code)]
                letter = name[0].upper() + ("?" if is_borderline(name) else "")
                ax.text(
                    j,
                    i,
                    letter,
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if name in ("sink", "local") else "black",
                    fontweight="bold" if is_borderline(name) else "normal",
                )
    set_label_ticks(ax, list(grid.columns), length=codes.shape[1] * cell)
    set_label_ticks(ax, list(grid.index), axis="y", length=codes.shape[0] * cell)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    counts = pd.Series(codes.ravel()).value_counts()
    handles = [_handle(name, int(counts.get(float(i), 0))) for i, name in enumerate(labels)]
    if given:
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
        return fig
    decided = "classes of the run means; sink? / local?: mean ± 1 std between runs holds the threshold"
    one_run = "" if runs >= 2 else "With one run: no interval, so no borderline label. "
    return finish(
        fig,
        title="Head classes",
        subtitle=subtitle(source, call, "head_class (head_diagnostics)", runs, decided),
        legend=handles,
        caption=(
            f"{one_run}sink: frame0_ratio (softmax mass on frame 0 ÷ the mass uniform attention over the key tokens "
            "would give it) ≥ sink_ratio; else local: recent_ratio (mass on the block's own frames and the frame "
            "before ÷ their uniform share) ≥ local_ratio; else periodic: the run-averaged logit profile's dominant "
            "period holds ≥ periodic_power of its spectral power; else diffuse. Each ratio is each run's own, "
            "averaged; hatched, lighter, '?': borderline, the ratio's mean ± its std between runs holds the "
            "threshold (thresholds: config diagnostics, docs/statistics.md). Letters: the class's initial."
        ),
    )
