"""The atlas tables: what each swept head, layer and cached frame does to the video.

A sweep (``sinkscope.sweeps``) runs one variant per item, each paired with the untouched
``default`` run of the same checkpoint, prompt and seed; ``variant_effects``
(``sinkscope.pipeline.effects``) holds each run's latent distance to it per frame. These
pure functions read those rows and the untouched run's attention and give, per run and
run-averaged (``prompt_id = '*'``, ``seed = -1``, ``runs``, ``<stat>_run_std``: the
sample std between runs, as every table has it):

- ``head_atlas``: per sweep of heads (or layers) and head: the drift the edit causes
  (``drift_last_block``: the mean ``latent_rel_distance`` over the frames of the last
  block; ``drift_after_block0``: over every frame after block 0, which no edit reaches),
  beside the untouched run's frame-0 mass of that head (``frame0_mass_default``: over its
  calls after block 0, as ``variant_head_effects`` has it) and its ``head_class``;
- ``frame_atlas``: per sweep of cached frames and frame: the same drifts, the drift over
  the blocks after the frame's own (``drift_after_frame``: where the edit can act), the
  untouched run's mass on that frame (``frame_mass_default``) and whether it is a sink
  frame;
- ``pruning_curve``: per ranked sweep, order and head count: the drifts of masking the
  first k heads of the atlas's order.

``atlas_job`` writes the three from a checkpoint's ``variant_effects`` and its untouched
runs' extraction folders; ``sinkscope.pipeline.headorders`` ranks a head atlas's heads for
the pruning runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sinkscope.errors import SinkscopeError
from sinkscope.interventions import Head
from sinkscope.pipeline.aggregate import extraction_files
from sinkscope.pipeline.effects import call_values, with_run_means
from sinkscope.pipeline.jobs import provenance
from sinkscope.pipeline.layout import ATLAS_TABLES
from sinkscope.sweeps import FRAME, HEAD, LAYER, RANKED, sweep_item
from sinkscope.tables import (
    ALL_PROMPTS,
    DEFAULT_VARIANT,
    FRAME_ATLAS_RUN_STD,
    HEAD_ATLAS_RUN_STD,
    PRUNING_CURVE_RUN_STD,
    SCHEMAS,
    read_table,
    write_table,
)

log = logging.getLogger("sinkscope")
# The untouched rows the atlases read.
ROW_COLUMNS = ["checkpoint", "variant", "prompt_id", "seed", "layer", "head", "block", "pass", "step"]
ROW_COLUMNS += ["query_frame", "key_frame", "prob_mass"]

RUN = ["checkpoint", "prompt_id", "seed"]
DRIFTS = ("drift_last_block", "drift_after_block0")


def _per_run(rows: pd.DataFrame) -> pd.DataFrame:
    """A table's per-run rows (the run-averaged ones dropped)."""
    return rows[rows["prompt_id"].astype(str) != ALL_PROMPTS]


def _swept(effects: pd.DataFrame, axes: Sequence[str]) -> pd.DataFrame:
    """The per-run variant_effects rows of the swept variants whose item runs over ``axes``,
    with their ``sweep`` and item."""
    rows = _per_run(effects)
    items = {variant: sweep_item(variant) for variant in pd.unique(rows["variant"].astype(str))}
    chosen = {variant: item for variant, item in items.items() if item is not None and item.axis in axes}
    rows = rows[rows["variant"].astype(str).isin(list(chosen))].copy()
    rows["variant"] = rows["variant"].astype(str)
    rows["sweep"] = rows["variant"].map({variant: item.sweep for variant, item in chosen.items()})
    return rows


def run_drift(effects: pd.DataFrame) -> pd.DataFrame:
    """Per run of each variant (checkpoint, variant, prompt_id, seed) of variant_effects rows:
    ``drift_last_block``, the mean ``latent_rel_distance`` over the frames of the run's
    last block, and ``drift_after_block0``, over its frames after block 0 (NaN without any)."""
    keys = ["checkpoint", "variant", "prompt_id", "seed"]
    rows = _per_run(effects)
    if rows.empty:
        return pd.DataFrame(columns=[*keys, *DRIFTS])
    last = rows.groupby(keys, observed=True)["block"].transform("max")
    distance = rows["latent_rel_distance"].astype(np.float64)
    parts = {
        "drift_last_block": distance.where(rows["block"] == last),
        "drift_after_block0": distance.where(rows["block"] >= 1),
    }
    table = rows[keys].assign(**parts)
    return table.groupby(keys, observed=True, sort=True)[list(DRIFTS)].mean().reset_index()


# -- the untouched run's attention -----------------------------------------------------------------


def default_head_mass(frame_attention: pd.DataFrame) -> pd.DataFrame:
    """Per run (checkpoint, prompt_id, seed), layer and head of the untouched (default)
    run's rows: ``frame0_mass_default``, the mean softmax mass on frame 0 over its calls
    after block 0 and their query frames (0 where frame 0 is not a key frame of the call),
    as ``variant_head_effects`` has it."""
    rows = frame_attention[frame_attention["variant"].astype(str) == "default"]
    parts = []
    for run, run_rows in rows.groupby(RUN, observed=True, sort=True):
        mass = call_values(run_rows, None)["frame0_mass"].groupby(level=["layer", "head"]).mean()
        parts.append(mass.rename("frame0_mass_default").reset_index().assign(**dict(zip(RUN, run))))
    if not parts:
        return pd.DataFrame(columns=[*RUN, "layer", "head", "frame0_mass_default"])
    return pd.concat(parts, ignore_index=True)[[*RUN, "layer", "head", "frame0_mass_default"]]


def default_frame_mass(frame_attention: pd.DataFrame) -> pd.DataFrame:
    """Per run and key frame of the untouched (default) run's rows: ``frame_mass_default``,
    the mean softmax mass on the frame over every captured head and every call of a later
    block whose keys hold it, query frames averaged (a frame a window evicted counts only
    where it is held)."""
    rows = frame_attention[frame_attention["variant"].astype(str) == "default"]
    block_start = rows.groupby([*RUN, "block"], observed=True)["query_frame"].transform("min")
    cached = rows[rows["key_frame"] < block_start]
    table = cached.groupby([*RUN, "key_frame"], observed=True, sort=True)["prob_mass"].mean()
    return table.astype(np.float64).rename("frame_mass_default").reset_index()


def _ordered(table: pd.DataFrame, name: str, keys: list[str]) -> pd.DataFrame:
    """The table's columns in its schema's order, rows by ``keys`` then run (the average last)."""
    rows = table.sort_values([*keys, "prompt_id", "seed"], kind="stable", ignore_index=True)
    return rows.reindex(columns=SCHEMAS[name].names)


# -- the atlases -----------------------------------------------------------------------------------


def head_atlas(
    effects: pd.DataFrame,
    head_mass: pd.DataFrame,
    head_classes: Mapping[Head, str] | None = None,
) -> pd.DataFrame:
    """The head atlas of every sweep of heads and of layers in ``effects`` (variant_effects
    rows): per run and run-averaged, each swept head's (a layer's: ``head`` -1) drift, the
    untouched run's frame-0 mass of that head (``head_mass``: ``default_head_mass``; a
    layer: the mean of its heads') and its class (``head_classes``: the untouched run's,
    ``interventions.read_head_classes``; null where unknown or for a layer)."""
    rows = _swept(effects, (HEAD, LAYER))
    drift = run_drift(rows).merge(rows[["variant", "sweep"]].drop_duplicates(), on="variant")
    items = {variant: sweep_item(variant) for variant in drift["variant"]}
    drift["layer"] = [items[v].layer for v in drift["variant"]]
    drift["head"] = [items[v].head for v in drift["variant"]]
    mass = head_mass[[*RUN, "layer", "head", "frame0_mass_default"]].astype({"layer": int, "head": int})
    per_layer = mass.groupby([*RUN, "layer"], observed=True)["frame0_mass_default"].mean().reset_index()
    table = pd.concat(
        [
            drift[drift["head"] >= 0].merge(mass, on=[*RUN, "layer", "head"], how="left"),
            drift[drift["head"] < 0].merge(per_layer, on=[*RUN, "layer"], how="left"),
        ],
        ignore_index=True,
    )
    classes = head_classes or {}
    table["head_class"] = [classes.get((int(a), int(b))) for a, b in zip(table["layer"], table["head"])]
    table = table[[c for c in SCHEMAS["head_atlas"].names if c in table.columns and not c.endswith("_run_std")]]
    keys = ["checkpoint", "sweep", "variant", "layer", "head"]
    table = with_run_means(table.drop(columns="runs", errors="ignore"), keys, HEAD_ATLAS_RUN_STD, ["head_class"])
    return _ordered(table, "head_atlas", ["sweep", "layer", "head"])


def frame_atlas(effects: pd.DataFrame, frame_mass: pd.DataFrame, sink_frames: Sequence[int] = (0,)) -> pd.DataFrame:
    """The frame atlas of every sweep of cached frames in ``effects`` (variant_effects
    rows): per run and run-averaged, each swept frame's drifts, the drift over the blocks
    after the frame's own (``drift_after_frame``), the untouched run's mass on it
    (``frame_mass``: ``default_frame_mass``), its ``block`` and whether it is one of the
    policy's ``sink_frames`` (frame 0 without a sink)."""
    rows = _swept(effects, (FRAME,))
    drift = run_drift(rows).merge(rows[["variant", "sweep"]].drop_duplicates(), on="variant")
    drift["key_frame"] = [sweep_item(v).frame for v in drift["variant"]]
    # The swept frame's block, and the mean distance over the frames of later blocks, per run.
    keys = ["checkpoint", "variant", "prompt_id", "seed"]
    blocks = rows.set_index([*keys, "latent_frame"])["block"]
    frame_block = [
        blocks.get((*key, frame), np.nan)
        for key, frame in zip(drift[keys].itertuples(index=False, name=None), drift["key_frame"])
    ]
    drift["block"] = frame_block
    later = rows.merge(drift[[*keys, "block"]].rename(columns={"block": "frame_block"}), on=keys)
    later = later[later["block"] > later["frame_block"]]
    after = later.groupby(keys, observed=True)["latent_rel_distance"].mean().rename("drift_after_frame")
    drift = drift.merge(after.astype(np.float64).reset_index(), on=keys, how="left")
    mass = frame_mass[[*RUN, "key_frame", "frame_mass_default"]].astype({"key_frame": int})
    table = drift.merge(mass, on=[*RUN, "key_frame"], how="left")
    table["sink"] = table["key_frame"].isin([int(f) for f in sink_frames])
    table = table[[c for c in SCHEMAS["frame_atlas"].names if c in table.columns and not c.endswith("_run_std")]]
    table = with_run_means(
        table.drop(columns="runs", errors="ignore"),
        ["checkpoint", "sweep", "variant", "key_frame"],
        FRAME_ATLAS_RUN_STD,
        ["block", "sink"],
    )
    return _ordered(table, "frame_atlas", ["sweep", "key_frame"])


def pruning_curve(effects: pd.DataFrame) -> pd.DataFrame:
    """The pruning curves of every ranked sweep in ``effects`` (variant_effects rows): per
    run and run-averaged, per ``order`` (``all``: every head of the atlas, where the orders
    agree) and ``head_count`` (k), the drifts of editing the first k heads."""
    rows = _swept(effects, (RANKED,))
    drift = run_drift(rows).merge(rows[["variant", "sweep"]].drop_duplicates(), on="variant")
    drift["order"] = [sweep_item(v).order for v in drift["variant"]]
    drift["head_count"] = [sweep_item(v).count for v in drift["variant"]]
    table = drift[[c for c in SCHEMAS["pruning_curve"].names if c in drift.columns and not c.endswith("_run_std")]]
    table = with_run_means(table, ["checkpoint", "sweep", "variant", "order", "head_count"], PRUNING_CURVE_RUN_STD)
    return _ordered(table, "pruning_curve", ["sweep", "head_count", "order"])


# -- the job ---------------------------------------------------------------------------------------


def default_rows(folders: Sequence[str | Path]) -> pd.DataFrame:
    """The untouched (default) runs' frame rows of the columns the atlases read, from their
    verified extraction folders (a run's layer groups hold different layers)."""
    parts = []
    for folder in folders:
        for path in extraction_files(folder)["frames"]:
            rows = read_table(path, columns=ROW_COLUMNS)
            variants = set(rows["variant"].astype(str))
            if variants - {DEFAULT_VARIANT}:
                raise SinkscopeError(f"{folder}: the atlases read the {DEFAULT_VARIANT!r} runs, not {sorted(variants)}")
            parts.append(rows)
    if not parts:
        return pd.DataFrame(columns=ROW_COLUMNS)
    rows = pd.concat(parts, ignore_index=True)
    return rows.assign(variant=rows["variant"].astype(str), prompt_id=rows["prompt_id"].astype(str))


def atlas_job(inputs: Sequence[str | Path], outputs: Mapping[str, str | Path], params: Mapping[str, Any]) -> None:
    """One checkpoint's ``variant_effects`` table, its untouched (default) runs' extraction
    folders and, when given, its head classes file (``head_classes.json``) -> its
    ``head_atlas``, ``frame_atlas`` and ``pruning_curve`` tables (each may be empty: a study
    without frame sweeps has no frame atlas rows).

    ``params``: ``checkpoint``; ``sink_frames``: the untouched run's sink frames (its
    policy's ``sink_frames``, 0 without a sink: frame 0)."""
    began = time.perf_counter()
    checkpoint = str(params["checkpoint"])
    paths = [Path(p) for p in inputs]
    effects_files = [p for p in paths if p.suffix == ".parquet"]
    classes_files = [p for p in paths if p.suffix == ".json"]
    folders = [p for p in paths if p not in effects_files and p not in classes_files]
    if len(effects_files) != 1:
        raise SinkscopeError(
            f"checkpoint {checkpoint!r}: the atlases read one variant_effects table, given {effects_files}"
        )
    effects = read_table(effects_files[0])
    effects = effects[effects["checkpoint"].astype(str) == checkpoint]
    rows = default_rows(folders)
    head_classes = None
    if classes_files:
        from sinkscope.interventions import read_head_classes

        head_classes = read_head_classes(classes_files[0])
    sinks = int(params.get("sink_frames") or 0)
    tables = {
        "head_atlas": head_atlas(effects, default_head_mass(rows), head_classes),
        "frame_atlas": frame_atlas(effects, default_frame_mass(rows), range(sinks) if sinks > 0 else (0,)),
        "pruning_curve": pruning_curve(effects),
    }
    metadata = {
        **provenance("atlas_tables"),
        "checkpoint": checkpoint,
        "sink_frames": sinks,
        "variant_effects": str(effects_files[0]),
        "default_runs": [str(folder) for folder in folders],
        "head_classes": str(classes_files[0]) if classes_files else None,
    }
    for name in ATLAS_TABLES:
        write_table(tables[name], outputs[name], SCHEMAS[name], metadata)
    log.info(
        "atlases of %s: %s in %.2f s",
        checkpoint,
        ", ".join(f"{name} {len(tables[name])} rows" for name in ATLAS_TABLES),
        time.perf_counter() - began,
    )
