"""A published per-head label file (``diagnostics.reference_labels``, e.g. Pyramid
Forcing's) against the study's classes at one call: two confusion heat maps, the file's
labels (rows) against ``head_class`` and against the study's own ``pyramid_label``, with
the head counts in the cells and the agreement with ``pyramid_label`` in the title
(``sinkscope.stats.labels.agreement``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from sinkscope.figures.layout import finish, new_figure
from sinkscope.figures.text import call_label, subtitle
from sinkscope.figures.views import one_source, table
from sinkscope.stats.labels import agreement


def _heat_map(ax, counts: pd.DataFrame, gid: str, xlabel: str) -> None:
    values = counts.to_numpy(dtype=float)
    rows = values.sum(axis=1, keepdims=True)
    shares = np.divide(values, rows, out=np.zeros_like(values), where=rows > 0)
    image = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    image.set_gid(gid)
    ax.grid(False)
    for (i, j), count in np.ndenumerate(values):
        ax.text(
            j,
            i,
            str(int(count)),
            ha="center",
            va="center",
            fontsize=8,
            color="white" if shares[i, j] > 0.6 else "black",
        )
    ax.set_xticks(range(values.shape[1]), list(counts.columns), rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(values.shape[0]), list(counts.index), fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("label file")


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "label_agreement"
    diagnostics = one_source(table(tables, "head_diagnostics", kind), kind)
    if "reference_labels" not in tables:
        raise ValueError(f"figure {kind}: no label file given (config diagnostics.reference_labels)")
    step = options.get("step") or "last"
    result = agreement(diagnostics, tables["reference_labels"], step)
    pass_, index = result.call
    rows = diagnostics[(diagnostics["pass"] == pass_) & (diagnostics["step"] == index)]
    call = call_label(pass_, index, float(rows["timestep"].iloc[0]) if len(rows) else None)
    runs = int(rows["runs"].max()) if len(rows) else 0
    given = ax is not None
    if given:
        _heat_map(ax, result.by_label, "label-agreement-pyramid", "study's pyramid_label")
        return ax.figure
    fig = new_figure(9.0, 3.6)
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [max(4, result.by_class.shape[1]), 3.5]})
    _heat_map(left, result.by_class, "label-agreement-class", "study's head_class")
    _heat_map(right, result.by_label, "label-agreement-pyramid", "study's pyramid_label")
    missing = f"; {result.missing} heads of the file are not in the table" if result.missing else ""
    return finish(
        fig,
        title=f"Label file against the study: {result.agree} of {result.heads} heads agree ({result.percent:.0f}%)",
        subtitle=subtitle(
            source, call, "head_class, pyramid_label (head_diagnostics)", runs, "classes of the run means"
        ),
        caption=(
            "Cells: heads with that label in the file (row) and that class in the study (column); shade: share "
            "of the row. Codes: -1 wave (oscillating), 1 anchor (stable, compact), 2 veil (stable-sparse); the "
            "study's pyramid_label approximates the file's rule from the key-frame logit profile "
            f"(docs/statistics.md){missing}."
        ),
    )
