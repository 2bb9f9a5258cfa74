"""Every layer x head coloured by its class in head_diagnostics (sink, local, periodic,
diffuse; ``summaries.head_class_grid``), with a categorical legend that counts them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from sinkscope.figures.colours import CLASS_COLORS, cell_size, class_cmap
from sinkscope.figures.layout import finish, new_figure, set_label_ticks
from sinkscope.figures.text import call_label, subtitle
from sinkscope.figures.views import one_source, step_of, table
from sinkscope.stats.summaries import HEAD_CLASSES, head_class_grid


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "head_classes"
    diagnostics = one_source(table(tables, "head_diagnostics", kind), kind)
    step = options.get("step") or "last"
    grid = head_class_grid(diagnostics, step)
    pass_, index = step_of(diagnostics, step)
    rows = diagnostics[(diagnostics["pass"] == pass_) & (diagnostics["step"] == index)]
    call = call_label(pass_, index, float(rows["timestep"].iloc[0]) if len(rows) else None)
    runs = int(rows["runs"].max()) if len(rows) else 0
    classes = list(HEAD_CLASSES) + sorted(set(grid.stack().dropna()) - set(HEAD_CLASSES))
    codes = grid.apply(lambda col: col.map({name: i for i, name in enumerate(classes)})).to_numpy(dtype=float)
    cell = cell_size(*codes.shape, largest=0.5, smallest=0.2, budget=10)
    given = ax is not None
    fig = ax.figure if given else new_figure(max(5.0, codes.shape[1] * cell + 1.2), max(2.5, codes.shape[0] * cell + 0.9))
    ax = ax if given else fig.add_subplot()
    cmap = class_cmap(classes)
    image = ax.imshow(np.ma.masked_invalid(codes), cmap=cmap, vmin=-0.5, vmax=len(classes) - 0.5, aspect="auto",
                      interpolation="nearest")  # fmt: skip
    image.set_gid("head-classes")
    ax.grid(False)
    # Letters in the cells too: the classes stay readable without colour.
    if cell >= 0.3:
        for (i, j), code in np.ndenumerate(codes):
            if np.isfinite(code):
                name = classes[int(code)]
                ax.text(j, i, name[0].upper(), ha="center", va="center", fontsize=7,
                        color="white" if name in ("sink", "local") else "black")  # fmt: skip
    set_label_ticks(ax, list(grid.columns), length=codes.shape[1] * cell)
    set_label_ticks(ax, list(grid.index), axis="y", length=codes.shape[0] * cell)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    counts = pd.Series(codes.ravel()).value_counts()
    handles = [Patch(facecolor=CLASS_COLORS.get(name, "#888888"), edgecolor="0.5", lw=0.5,
                     label=f"{name} ({int(counts.get(float(i), 0))})") for i, name in enumerate(classes)]  # fmt: skip
    if given:
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
        return fig
    thresholds = "thresholds: config diagnostics (docs/statistics.md)"
    return finish(
        fig,
        title="Head classes",
        subtitle=subtitle(source, call, "head_class (head_diagnostics)", runs,
                          "classes of the run means, spread in head_diagnostics *_run_std"),
        legend=handles,
        caption=("sink: softmax mass on frame 0 ≥ sink_mass; else local: mass on the block's own frames and the frame "
                 "before ≥ local_mass; else periodic: the logit profile's dominant period holds ≥ periodic_power of its "
                 f"spectral power; else diffuse ({thresholds}). Letters: the class's initial."),
    )  # fmt: skip
