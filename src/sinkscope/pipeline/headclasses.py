"""The untouched run's head classes, for edits that select heads by class (``class:sink``).

One job per checkpoint whose variants select heads by class: it reads the ``default``
variant's ``head_diagnostics`` table of that checkpoint (``pipeline.aggregate`` builds it
from the extraction folders with ``stats.summaries.head_diagnostics``, the classes of the
summary page and of ``head_classes.csv``) and writes, for the call the classes are read
at (the last block's last denoising step, as ``head_classes.csv``), each captured head's
label as JSON (``interventions.write_head_classes``). The extraction jobs of those
variants read it with ``read_head_classes`` and turn their ``class:`` selections into
lists (``interventions.with_head_classes``); both live in ``sinkscope.interventions``, so
that the extraction's code digest does not hold the classification's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from sinkscope.errors import SinkscopeError
from sinkscope.interventions import read_head_classes, write_head_classes

__all__ = ["HEAD_CLASS_STEP", "head_classes", "head_classes_job", "read_head_classes", "write_head_classes"]

log = logging.getLogger("sinkscope")

# The call whose classes the edits use: the last denoising step of the last block.
HEAD_CLASS_STEP = "last"


def head_classes(diagnostics, step: str | int = HEAD_CLASS_STEP) -> tuple[dict[tuple[int, int], str], tuple[str, int]]:
    """(layer, head) -> head_class of one source's ``head_diagnostics`` rows at ``step``,
    and the (pass, step) they come from."""
    from sinkscope.stats.summaries import resolve_step

    if diagnostics.empty:
        raise SinkscopeError("head_diagnostics has no rows: the untouched run has no classes to select heads by")
    variants = sorted(set(diagnostics["variant"].astype(str)))
    if len(variants) != 1:
        raise SinkscopeError(
            f"head_diagnostics holds variants {variants}; the head classes come from one source's table"
        )
    pass_, index = resolve_step(diagnostics, step)
    chosen = diagnostics[(diagnostics["pass"] == pass_) & (diagnostics["step"] == index)]
    classes = {
        (int(layer), int(head)): str(label)
        for layer, head, label in zip(chosen["layer"], chosen["head"], chosen["head_class"])
    }
    return dict(sorted(classes.items())), (pass_, index)


def head_classes_job(*, diagnostics: str | Path, output: str | Path) -> None:
    """One checkpoint's untouched (``default``) ``head_diagnostics.parquet`` -> its head classes."""
    from sinkscope.tables import read_table

    table = read_table(diagnostics)
    classes, call = head_classes(table)
    source = str(table["checkpoint"].iloc[0])
    write_head_classes(output, classes, source=source, call=call)
    counts: dict[str, int] = {}
    for label in classes.values():
        counts[label] = counts.get(label, 0) + 1
    log.info("head classes of %s at %s step %d: %s", source, call[0], call[1], json.dumps(counts, sort_keys=True))
