"""The head orders of a head atlas, for the pruning curve's runs (``atlas:`` selections).

One job per head sweep that a pruning sweep ranks (``over: atlas:<sweep>``): from the
extraction folders of the sweep's runs and of the untouched runs it makes the sweep's
``head_atlas`` rows as the atlas tables have them (``sinkscope.pipeline.effects.latent_effects``,
``sinkscope.pipeline.atlas.head_atlas``; not read from the checkpoint's head_atlas table,
whose variant_effects pairs the pruning runs too, which wait for this file) and writes,
per order of ``HEAD_ORDERS``, the sweep's heads first to last
(``sinkscope.interventions.write_head_orders``):

- ``drift``: least ``drift_last_block`` first (the heads the atlas says the video needs least);
- ``random``: a fixed random order, by a hash of the sweep's name and each head (the control);
- ``frame0_mass``: least untouched frame-0 mass first (the attention-pattern rule).

The pruning runs' extraction jobs read it (``interventions.read_head_orders``) and turn
their ``atlas:`` selections into lists (``interventions.with_head_orders``). The file's
bytes are the orders alone: remaking it with the same orders (after an edit of the atlas
code) reruns no pruning run (Snakemake compares a small input's checksum).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from sinkscope.interventions import HEAD_ORDERS, Head, write_head_orders
from sinkscope.tables import ALL_PROMPTS

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


def head_orders_job(*, folders: Sequence[str | Path], output: str | Path, checkpoint: str, sweep: str) -> None:
    """The extraction folders of head sweep ``sweep``'s runs and of the untouched runs of
    ``checkpoint`` -> the sweep's head orders."""
    from sinkscope.pipeline.atlas import default_head_mass, default_rows, head_atlas
    from sinkscope.pipeline.effects import latent_effects
    from sinkscope.sweeps import is_atlas_run

    effects = latent_effects(checkpoint, folders)
    effects = effects[effects["variant"].astype(str).str.startswith(f"{sweep}/")]
    defaults = [folder for folder in folders if not is_atlas_run(_variant_of(folder))]
    table = head_atlas(effects, default_head_mass(default_rows(defaults)))
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


def _variant_of(folder: str | Path) -> str:
    """The variant an extraction folder's rows record."""
    from sinkscope.pipeline.aggregate import extraction_files
    from sinkscope.tables import DEFAULT_VARIANT, read_metadata

    return str(read_metadata(extraction_files(folder)["frames"][0]).get("variant", DEFAULT_VARIANT))
