"""The head orders of a head atlas, for the pruning curve's runs (``atlas:`` selections).

One job per head sweep that a pruning sweep ranks (``over: atlas:<sweep>``): it reads the
checkpoint's ``head_atlas`` table (``sinkscope.pipeline.atlas``) and writes, per order of
``HEAD_ORDERS``, the sweep's heads first to last (``sinkscope.sweeps.write_head_orders``):

- ``drift``: least ``drift_last_block`` first (the heads the atlas says the video needs least);
- ``random``: a fixed random order, by a hash of the sweep's name and each head (the control);
- ``frame0_mass``: least untouched frame-0 mass first (the attention-pattern rule).

The pruning runs' extraction jobs read it (``sweeps.read_head_orders``) and turn their
``atlas:`` selections into lists (``interventions.with_head_orders``); its own module, so
that editing the atlas tables' code reruns no pruning run.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from sinkscope.interventions import HEAD_ORDERS, Head
from sinkscope.sweeps import write_head_orders
from sinkscope.tables import ALL_PROMPTS, read_table

__all__ = ["head_orders", "head_orders_job", "random_order"]

log = logging.getLogger("sinkscope")


def random_order(heads: Sequence[Head], key: str) -> list[Head]:
    """``heads`` in a fixed random order for ``key`` (the atlas's name): by a hash of the key
    and the head, the same on every machine."""
    return sorted(heads, key=lambda head: hashlib.sha256(f"{key}:{head[0]}:{head[1]}".encode()).hexdigest())


def head_orders(atlas: pd.DataFrame, sweep: str, checkpoint: str | None = None) -> dict[str, list[Head]]:
    """The orders of a head sweep's heads in its head_atlas rows (run-averaged): ``drift``,
    least ``drift_last_block`` first; ``random``, seeded by the sweep's name; and
    ``frame0_mass``, least ``frame0_mass_default`` first (the attention-pattern rule);
    ties, and heads without a value (last), in (layer, head) order."""
    rows = atlas[(atlas["sweep"].astype(str) == sweep) & (atlas["prompt_id"].astype(str) == ALL_PROMPTS)]
    if checkpoint is not None:
        rows = rows[rows["checkpoint"].astype(str) == checkpoint]
    if rows.empty:
        raise ValueError(f"the head atlas holds no run-averaged rows of sweep {sweep!r}")
    if (rows["head"] < 0).any():
        raise ValueError(f"sweep {sweep!r} runs over layers; the pruning curve ranks heads")
    if rows.duplicated(["layer", "head"]).any():
        raise ValueError(f"the head atlas holds sweep {sweep!r} twice for a head (pick one checkpoint)")
    rows = rows.sort_values(["layer", "head"], kind="stable")
    heads = [(int(a), int(b)) for a, b in zip(rows["layer"], rows["head"])]

    def by(column: str) -> list[Head]:
        values = rows[column].to_numpy(dtype=np.float64)
        index = np.lexsort((np.arange(len(values)), np.where(np.isnan(values), np.inf, values)))
        return [heads[i] for i in index]

    orders = {
        "drift": by("drift_last_block"),
        "random": random_order(heads, sweep),
        "frame0_mass": by("frame0_mass_default"),
    }
    return {order: orders[order] for order in HEAD_ORDERS}


def head_orders_job(*, atlas: str | Path, output: str | Path, checkpoint: str, sweep: str) -> None:
    """One checkpoint's ``head_atlas.parquet`` -> the head orders of its head sweep ``sweep``."""
    table = read_table(atlas)
    orders = head_orders(table, sweep, checkpoint)
    rows = table[(table["sweep"].astype(str) == sweep) & (table["prompt_id"].astype(str) == ALL_PROMPTS)]
    runs = int(rows["runs"].max()) if len(rows) else 0
    write_head_orders(output, orders, checkpoint=checkpoint, sweep=sweep, runs=runs)
    first = ", ".join(f"{order} {orders[order][0]}" for order in HEAD_ORDERS)
    log.info(
        "head orders of %s/%s over %d heads and %d runs (first: %s)",
        checkpoint,
        sweep,
        len(orders["drift"]),
        runs,
        first,
    )
