"""A published per-head label file against the study's head classes.

``agreement(diagnostics, labels)`` crosses, at one call of one source, the file's label
of every head with the study's ``head_class`` and with its own ``pyramid_label`` (the
same taxonomy, computed by ``summaries.pyramid_label``): confusion counts, and the share
of heads on which the file and ``pyramid_label`` agree. Heads the table lacks (layers
not extracted) are left out, and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from sinkscope.labels import PYRAMID_LABELS, label_name
from sinkscope.stats.summaries import HEAD_CLASSES, resolve_step


def reference_frame(labels: Sequence[Sequence[int]]) -> pd.DataFrame:
    """A label grid (``labels[layer][head]``) as rows of layer, head, reference."""
    return pd.DataFrame(
        [(layer, head, int(code)) for layer, row in enumerate(labels) for head, code in enumerate(row)],
        columns=["layer", "head", "reference"],
    )


@dataclass(frozen=True)
class Agreement:
    by_class: pd.DataFrame  # rows: the file's labels, columns: head_class; head counts
    by_label: pd.DataFrame  # rows: the file's labels, columns: pyramid_label; head counts
    heads: int  # heads in both
    agree: int  # heads whose pyramid_label is the file's label
    missing: int  # heads of the file the table lacks
    call: tuple[str, int]  # (pass, step) compared

    @property
    def percent(self) -> float:
        return 100.0 * self.agree / self.heads if self.heads else float("nan")

    def text(self) -> str:
        lines = [
            f"reference labels (rows) against head_class (columns), heads at {self.call[0]} step {self.call[1]}:",
            self.by_class.to_string(),
            "",
            "reference labels (rows) against the study's pyramid_label (columns):",
            self.by_label.to_string(),
            "",
            f"agreement with pyramid_label: {self.agree} of {self.heads} heads ({self.percent:.1f}%)",
        ]
        if self.missing:
            lines.append(f"{self.missing} heads of the label file are not in the table")
        return "\n".join(lines)


def agreement(
    diagnostics: pd.DataFrame, labels: Sequence[Sequence[int]] | pd.DataFrame, step: str | int = "last"
) -> Agreement:
    """Confusion counts of the file's labels against ``head_class`` and ``pyramid_label`` at
    one call (``step``: last, cache or a denoising step index) of one source's diagnostics."""
    reference = labels if isinstance(labels, pd.DataFrame) else reference_frame(labels)
    if diagnostics.empty:
        raise ValueError("agreement: the head_diagnostics table has no rows")
    sources = diagnostics[["checkpoint", "variant"]].drop_duplicates()
    if len(sources) > 1:
        names = ", ".join(sorted(f"{c}@{v}" for c, v in sources.itertuples(index=False)))
        raise ValueError(f"agreement: the table holds several sources ({names}); pick one")
    pass_, index = resolve_step(diagnostics, step)
    rows = diagnostics[(diagnostics["pass"] == pass_) & (diagnostics["step"] == index)]
    rows = rows[["layer", "head", "head_class", "pyramid_label"]].astype({"layer": int, "head": int})
    both = reference.merge(rows, on=["layer", "head"], how="inner")
    codes = list(PYRAMID_LABELS)
    names = {code: label_name(code) for code in codes}
    extra = sorted(set(both["head_class"]) - set(HEAD_CLASSES))
    by_class = pd.crosstab(both["reference"], both["head_class"]).reindex(
        index=codes, columns=[*HEAD_CLASSES, *extra], fill_value=0
    )
    by_label = pd.crosstab(both["reference"], both["pyramid_label"].astype(int)).reindex(
        index=codes, columns=sorted({*codes, *both["pyramid_label"].astype(int)}), fill_value=0
    )
    by_class.index = by_label.index = [names[c] for c in codes]
    by_label.columns = [names.get(c, f"none ({c})") for c in by_label.columns]
    by_class.index.name = by_label.index.name = "reference"
    by_class.columns.name, by_label.columns.name = "head_class", "pyramid_label"
    return Agreement(
        by_class=by_class.astype(int),
        by_label=by_label.astype(int),
        heads=len(both),
        agree=int((both["reference"] == both["pyramid_label"]).sum()),
        missing=len(reference) - len(both),
        call=(pass_, index),
    )
