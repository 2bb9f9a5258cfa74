"""The paired effects job: every variant of a checkpoint against its untouched run.

An edited variant (``generation.interventions``, or another cache policy, or another
length) runs with the same checkpoint, prompt and seed, hence the same noise stream, as
the ``default`` variant; the difference between the two runs is the edit's effect. This
job pairs them from the extraction folders alone (the final latents kept there, and the
rows), with no GPU:

- ``variant_effects``: per (variant, prompt, seed, latent frame), over the frames both
  runs have: the latent frame's L2 distance to the untouched frame over the untouched
  frame's norm (``latent_rel_distance``), their cosine (``latent_cosine``), the frame's
  change from the previous frame over the same change in the untouched video
  (``flicker``; NaN at frame 0, which has no previous frame), and the frame's cosine to
  frame 0 of its own video (``first_frame_similarity``, the drift proxy) beside the
  untouched video's (``first_frame_similarity_default``). ``block``: the frame's block
  under the variant.
- ``variant_head_effects``: per (variant, prompt, seed, captured layer, head), over the
  calls after block 0 (block 0 has no cache, so no edit touches it) that both runs
  make, matched by block, pass, step and query frame: the softmax mass on frame 0
  (0 where frame 0 is not among the call's key frames) and the token-level attention
  entropy (query_stats ``entropy_tokens``, nats), each run's mean and the mean change;
  ``edited``: the head is named by a ``mask_keys`` or ``logit_bias`` edit of the variant.

Both tables hold the per-run rows and, as head_stats does, run-averaged rows
(``prompt_id = '*'``, ``seed = -1``) with ``runs`` and ``<stat>_run_std`` (the sample std
between runs), which the figures draw.

Vectors are compared in float64. The cosine is computed as 1 - |a/|a| - b/|b||^2 / 2,
which is exactly 1 for equal vectors and keeps its precision for nearly equal ones.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sinkscope.errors import SinkscopeError
from sinkscope.pipeline.aggregate import extraction_files
from sinkscope.pipeline.jobs import provenance
from sinkscope.pipeline.latents import read_latents
from sinkscope.stats.summaries import with_run_std
from sinkscope.tables import (
    ALL_PROMPTS,
    ALL_SEEDS,
    DEFAULT_VARIANT,
    EFFECTS_RUN_STD,
    HEAD_EFFECTS_RUN_STD,
    RUN_KEYS,
    RUN_STD_SUFFIX,
    SCHEMAS,
    read_metadata,
    read_table,
    write_table,
)

log = logging.getLogger("sinkscope")

FRAME_STATS = EFFECTS_RUN_STD
HEAD_STATS = HEAD_EFFECTS_RUN_STD
# A call of one head and query frame: how the rows of two runs are matched.
CALL_KEYS = ["layer", "head", "block", "pass", "step", "query_frame"]


# -- the latents ---------------------------------------------------------------------------------


def _frames(latents: np.ndarray) -> np.ndarray:
    """[C, F, H, W] -> one float64 vector per latent frame, [F, C*H*W]."""
    return np.moveaxis(np.asarray(latents, dtype=np.float64), 1, 0).reshape(latents.shape[1], -1)


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine, as 1 - |â - b̂|² / 2 (exactly 1 for equal rows); NaN for a zero row."""
    with np.errstate(invalid="ignore", divide="ignore"):
        unit_a = a / np.linalg.norm(a, axis=1, keepdims=True)
        unit_b = b / np.linalg.norm(b, axis=1, keepdims=True)
        return 1.0 - 0.5 * np.sum((unit_a - unit_b) ** 2, axis=1)


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, NaN where the denominator is 0 (never an exception)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1.0), np.nan)


def frame_effects(latents: np.ndarray, reference: np.ndarray) -> dict[str, np.ndarray]:
    """Per latent frame of the frames both runs have (the first min(F, F_ref)): the
    variant's ``latents`` [C, F, H, W] against the untouched ``reference``."""
    if latents.shape[0] != reference.shape[0] or latents.shape[2:] != reference.shape[2:]:
        raise ValueError(f"latents of shape {list(latents.shape)} and {list(reference.shape)} share no frame layout")
    count = min(latents.shape[1], reference.shape[1])
    x, ref = _frames(latents)[:count], _frames(reference)[:count]
    ref_norm = np.linalg.norm(ref, axis=1)
    step = np.full(count, np.nan)
    ref_step = np.full(count, np.nan)
    step[1:] = np.linalg.norm(np.diff(x, axis=0), axis=1)
    ref_step[1:] = np.linalg.norm(np.diff(ref, axis=0), axis=1)
    return {
        "latent_frame": np.arange(count),
        "latent_rel_distance": _ratio(np.linalg.norm(x - ref, axis=1), ref_norm),
        "latent_cosine": _cosine(x, ref),
        "flicker": _ratio(step, ref_step),
        "first_frame_similarity": _cosine(x, np.broadcast_to(x[:1], x.shape)),
        "first_frame_similarity_default": _cosine(ref, np.broadcast_to(ref[:1], ref.shape)),
    }


def frame_blocks(block_sizes: Sequence[int], count: int) -> np.ndarray:
    """The block of each of the first ``count`` latent frames."""
    blocks = np.repeat(np.arange(len(block_sizes)), [int(size) for size in block_sizes])
    if len(blocks) < count:  # a run longer than its sizes say (never written so): the last block goes on
        blocks = np.concatenate([blocks, np.full(count - len(blocks), len(block_sizes) - 1)])
    return blocks[:count]


# -- the attention -------------------------------------------------------------------------------


def call_values(frames: pd.DataFrame, queries: pd.DataFrame | None) -> pd.DataFrame:
    """Per call after block 0, head and query frame (``CALL_KEYS``): the softmax mass on
    frame 0 (0 where frame 0 is not a key frame of the call; summed where it appears
    twice, as under rolling_sink) and the token-level entropy (NaN without query rows)."""
    rows = frames[frames["block"] >= 1]
    rows = rows.assign(**{"pass": rows["pass"].astype(str)})
    calls = rows[CALL_KEYS].drop_duplicates().set_index(CALL_KEYS)
    mass = rows[rows["key_frame"] == 0].groupby(CALL_KEYS, observed=True)["prob_mass"].sum()
    calls["frame0_mass"] = mass.reindex(calls.index).fillna(0.0).astype(np.float64)
    if queries is not None and len(queries):
        q = queries[queries["block"] >= 1]
        q = q.assign(**{"pass": q["pass"].astype(str)})
        entropy = q.groupby(CALL_KEYS, observed=True)["entropy_tokens"].mean()
        calls["entropy_tokens"] = entropy.reindex(calls.index).astype(np.float64)
    else:
        calls["entropy_tokens"] = np.nan
    return calls


def head_effects(variant: pd.DataFrame, default: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, head): the two runs' ``call_values`` matched call by call (inner join),
    averaged: each run's mean, the mean change and the number of matched calls."""
    both = variant.join(default.add_suffix("_default"), how="inner")
    both["frame0_mass_change"] = both["frame0_mass"] - both["frame0_mass_default"]
    both["entropy_tokens_change"] = both["entropy_tokens"] - both["entropy_tokens_default"]
    grouped = both.groupby(level=["layer", "head"], observed=True)
    out = grouped[list(HEAD_STATS)].mean()
    out["calls"] = grouped.size()
    return out.reset_index()


def edited_heads(
    edits: Sequence[Mapping[str, Any]],
    where: str,
    num_layers: int,
    num_heads: int,
    head_classes: Mapping[tuple[int, int], str] | None = None,
    head_orders: Mapping[str, Mapping[str, Sequence[tuple[int, int]]]] | None = None,
) -> frozenset[tuple[int, int]]:
    """The (layer, head) pairs named by the ``mask_keys`` / ``logit_bias`` edits among a
    variant's ``interventions`` (their config form; ``where`` names them in errors);
    ``class:`` selections resolved with ``head_classes``, ``atlas:`` ones with ``head_orders``."""
    from sinkscope import interventions

    parsed = interventions.parse_interventions(list(edits), where)
    heads = interventions.edited_heads(parsed, num_layers, num_heads, head_classes, head_orders)
    return frozenset((int(layer), int(head)) for layer, head in heads)


def _needs_classes(edits: Sequence[Mapping[str, Any]], where: str) -> bool:
    from sinkscope import interventions

    return bool(interventions.class_selections(interventions.parse_interventions(list(edits), where)))


def _atlases(edits: Sequence[Mapping[str, Any]], where: str) -> list[str]:
    from sinkscope import interventions

    return interventions.atlas_selections(interventions.parse_interventions(list(edits), where))


def _edit_files(paths: Sequence[Path]) -> tuple[list[Path], list[Path]]:
    """The JSON inputs split by their format: head classes files, head orders files (a file
    that is neither goes with the classes, whose reader names it damaged)."""
    from sinkscope.sweeps import HEAD_ORDERS_FORMAT

    classes, orders = [], []
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            data = None
        (orders if isinstance(data, dict) and data.get("format") == HEAD_ORDERS_FORMAT else classes).append(path)
    return classes, orders


# -- the runs' spread ----------------------------------------------------------------------------


def with_run_means(
    per_run: pd.DataFrame, keys: Sequence[str], stats: Sequence[str], constant: Sequence[str] = ()
) -> pd.DataFrame:
    """The per-run rows (``runs`` 1, ``<stat>_run_std`` null) and, per ``keys``, the
    run-averaged row (prompt_id '*', seed -1): each stat's mean over the runs, the
    number of runs, and ``<stat>_run_std``, the sample std (ddof 1) between runs (null
    with one run). ``constant`` columns are the same in every run (taken from the first)."""
    rows = per_run.assign(runs=1, **{name + RUN_STD_SUFFIX: np.nan for name in stats})
    if per_run.empty:
        return rows
    grouped = per_run.groupby(list(keys), observed=True, sort=True)
    averaged = grouped[list(stats)].mean().join(grouped.size().rename("runs"))  # one row per run and key
    if constant:
        averaged = averaged.join(grouped[list(constant)].first())
    averaged = averaged.reset_index().assign(prompt_id=ALL_PROMPTS, seed=ALL_SEEDS)
    # The spread between runs as every other table has it (summaries.with_run_std).
    table = pd.concat([rows, averaged.reindex(columns=rows.columns)], ignore_index=True)
    return with_run_std(table, keys, stats)


# -- the job -------------------------------------------------------------------------------------


class _Run:
    """One run's extraction folders (one per layer group): its latents and its rows."""

    def __init__(self, key: tuple[str, str, str, int]) -> None:
        self.key = key
        self.folders: list[Path] = []
        self.files: dict[Path, dict[str, list[Path]]] = {}  # per folder, its verified layer files
        self.meta: dict[str, Any] = {}

    def latents(self) -> np.ndarray:
        # read_latents checks the bytes against the digest written with them and the rows'
        # latents_sha256; a problem names the folder, the job's output, rebuilt whole.
        return read_latents(self.folders[0], self.meta.get("latents_sha256"))

    def calls(self) -> pd.DataFrame:
        parts = []
        for folder in self.folders:
            files = self.files[folder]
            queries = {Path(p).name.split(".")[0]: p for p in files["queries"]}
            for path in files["frames"]:
                frames = read_table(path, columns=[*CALL_KEYS, "key_frame", "prob_mass"])
                query_file = queries.get(Path(path).name.split(".")[0])
                query_rows = read_table(query_file, columns=[*CALL_KEYS, "entropy_tokens"]) if query_file else None
                parts.append(call_values(frames, query_rows))
        return pd.concat(parts) if parts else pd.DataFrame(columns=["frame0_mass", "entropy_tokens"])


def _runs(folders: Iterable[str | Path]) -> dict[tuple[str, str, str, int], _Run]:
    """The extraction folders grouped by run (checkpoint, variant, prompt, seed), read
    from their rows' metadata; layer groups in the order given."""
    runs: dict[tuple[str, str, str, int], _Run] = {}
    for folder in map(Path, folders):
        files = extraction_files(folder)
        meta = read_metadata(files["frames"][0])
        key = (
            str(meta["checkpoint"]),
            str(meta.get("variant", DEFAULT_VARIANT)),
            str(meta["prompt_id"]),
            int(meta["seed"]),
        )
        run = runs.setdefault(key, _Run(key))
        run.folders.append(folder)
        run.files[folder] = files
        if run.meta and run.meta.get("latents_sha256") != meta.get("latents_sha256"):
            log.warning(
                "run %s: layer groups generated different latents (a capture route that is not video-exact, "
                "or jobs that ran different attention kernels); the effects use the first group's (%s)",
                "/".join(map(str, key)),
                run.folders[0],
            )
        run.meta = run.meta or meta
    return runs


def effects_job(inputs: Sequence[str | Path], outputs: Mapping[str, str | Path], params: Mapping[str, Any]) -> None:
    """One checkpoint's extraction folders (every variant, prompt, seed and layer group;
    the head classes file when an edit selects heads by class, and the head orders file of
    each head atlas an edit selects by, ``atlas:``) -> its ``variant_effects`` and
    ``variant_head_effects`` tables.

    ``params``: ``checkpoint``; ``interventions``: variant -> its edits (config form)."""
    began = time.perf_counter()
    checkpoint = params["checkpoint"]
    interventions: Mapping[str, list] = params.get("interventions") or {}
    classes_files, orders_files = _edit_files([Path(p) for p in inputs if str(p).endswith(".json")])
    runs = _runs(p for p in inputs if not str(p).endswith(".json"))
    defaults, paired = _paired_runs(checkpoint, runs)
    head_classes = _head_classes(checkpoint, interventions, classes_files)
    head_orders = _head_orders(checkpoint, interventions, orders_files)
    frame_parts, head_parts = _pair_effects(checkpoint, defaults, paired, interventions, head_classes, head_orders)
    frame_table = (
        pd.concat(frame_parts, ignore_index=True)
        if frame_parts
        else pd.DataFrame(columns=[*RUN_KEYS, "latent_frame", "block", *FRAME_STATS])
    )
    head_table = (
        pd.concat(head_parts, ignore_index=True)
        if head_parts
        else pd.DataFrame(columns=[*RUN_KEYS, "layer", "head", "calls", "edited", *HEAD_STATS])
    )
    frame_table = with_run_means(frame_table, ["checkpoint", "variant", "latent_frame"], EFFECTS_RUN_STD, ["block"])
    head_table = with_run_means(
        head_table, ["checkpoint", "variant", "layer", "head"], HEAD_EFFECTS_RUN_STD, ["calls", "edited"]
    )
    metadata = _effects_metadata(checkpoint, runs, defaults, interventions)
    write_table(
        frame_table.sort_values(["variant", "prompt_id", "seed", "latent_frame"], kind="stable"),
        outputs["variant_effects"],
        SCHEMAS["variant_effects"],
        metadata,
    )
    write_table(
        head_table.sort_values(["variant", "prompt_id", "seed", "layer", "head"], kind="stable"),
        outputs["variant_head_effects"],
        SCHEMAS["variant_head_effects"],
        metadata,
    )
    log.info(
        "variant effects of %s: %d runs paired, %d frame rows, %d head rows in %.2f s",
        checkpoint,
        len(paired),
        len(frame_table),
        len(head_table),
        time.perf_counter() - began,
    )


def _paired_runs(checkpoint: str, runs: Mapping[tuple, Any]) -> tuple[dict, list]:
    """The untouched runs by (prompt, seed), and every other variant's run, each of which
    must have its untouched run of the same prompt and seed."""
    defaults = {key[2:]: run for key, run in runs.items() if key[1] == DEFAULT_VARIANT}
    if not defaults:
        raise SinkscopeError(
            f"checkpoint {checkpoint!r}: the variant effects need the {DEFAULT_VARIANT!r} variant's runs"
        )
    paired = [(key, run) for key, run in sorted(runs.items()) if key[1] != DEFAULT_VARIANT]
    missing = next(((key, run) for key, run in paired if key[2:] not in defaults), None)
    if missing is not None:
        _, variant, prompt_id, seed = missing[0]
        raise SinkscopeError(
            f"checkpoint {checkpoint!r}, variant {variant!r}: no {DEFAULT_VARIANT!r} run of prompt "
            f"{prompt_id!r}, seed {seed} to pair it with"
        )
    return defaults, paired


def _head_classes(checkpoint: str, interventions: Mapping[str, list], classes_files: list[Path]):
    """The untouched run's head classes, when an edit selects heads by class; else None."""
    if not any(
        _needs_classes(edits or [], f"variants.{variant}.interventions") for variant, edits in interventions.items()
    ):
        return None
    if not classes_files:
        raise SinkscopeError(
            f"checkpoint {checkpoint!r}: an edit selects heads by class, and no head classes file was given"
        )
    # Where pipeline.headclasses takes it from too: the digest holds no classification code.
    from sinkscope.interventions import read_head_classes

    return read_head_classes(classes_files[0])


def _head_orders(checkpoint: str, interventions: Mapping[str, list], orders_files: list[Path]) -> dict[str, dict]:
    """The head orders of every head atlas an edit selects by (``atlas:``), from their files."""
    head_orders: dict[str, dict] = {}
    if orders_files:
        from sinkscope.sweeps import read_head_orders

        for path in orders_files:
            head_orders.update(read_head_orders(path))
    wanted = {
        atlas
        for variant, edits in interventions.items()
        for atlas in _atlases(edits or [], f"variants.{variant}.interventions")
    }
    if wanted - set(head_orders):
        raise SinkscopeError(
            f"checkpoint {checkpoint!r}: an edit selects heads by head atlas {sorted(wanted - set(head_orders))[0]!r} "
            "(atlas:), and no head orders file of it was given"
        )
    return head_orders


def _pair_effects(
    checkpoint: str,
    defaults: Mapping,
    paired: list,
    interventions: Mapping[str, list],
    head_classes,
    head_orders: Mapping[str, dict],
):
    """Each variant's run against the untouched run of its prompt and seed: per latent frame
    (latent distance ...) and per captured head (frame-0 mass and entropy, ``edited``)."""
    frame_parts, head_parts = [], []
    edited_cache: dict[str, frozenset] = {}
    # One untouched run at a time, with every variant paired with it (a long video's latents are large).
    for (prompt_id, seed), default in sorted(defaults.items()):
        variants = [(key, run) for key, run in paired if key[2:] == (prompt_id, seed)]
        if not variants:
            continue
        reference, reference_calls = default.latents(), default.calls()
        for (_, variant, _, _), run in variants:
            columns = {"checkpoint": checkpoint, "variant": variant, "prompt_id": prompt_id, "seed": seed}
            table = _frame_table(run, reference, columns)
            if table is not None:
                frame_parts.append(table)
            if variant not in edited_cache:
                model = run.meta.get("model_config") or {}
                edited_cache[variant] = edited_heads(
                    interventions.get(variant) or [],
                    f"variants.{variant}.interventions",
                    int(model.get("num_layers", 0)),
                    int(model.get("num_heads", 0)),
                    head_classes,
                    head_orders,
                )
            heads = head_effects(run.calls(), reference_calls).assign(**columns)
            edited = edited_cache[variant]
            heads["edited"] = [(int(a), int(b)) in edited for a, b in zip(heads["layer"], heads["head"])]
            head_parts.append(heads)
    return frame_parts, head_parts


def _frame_table(run: _Run, reference: np.ndarray, columns: Mapping[str, Any]) -> pd.DataFrame | None:
    """One run's variant_effects rows against the untouched latents ``reference`` (None,
    with a warning, when the two share no frame layout)."""
    latents = run.latents()
    try:
        effects = frame_effects(latents, reference)
    except ValueError as error:
        log.warning(
            "variant %s, prompt %s, seed %d: no latent effects (%s)",
            columns["variant"],
            columns["prompt_id"],
            columns["seed"],
            error,
        )
        return None
    table = pd.DataFrame(effects).assign(**columns)
    table["block"] = frame_blocks(run.meta.get("block_sizes") or [latents.shape[1]], len(table))
    return table


def latent_effects(checkpoint: str, folders: Iterable[str | Path]) -> pd.DataFrame:
    """The per-run variant_effects rows (latents alone: no run means, no attention) of the
    runs among the extraction ``folders`` against the untouched runs among them."""
    defaults, paired = _paired_runs(checkpoint, _runs(folders))
    parts = []
    for (prompt_id, seed), default in sorted(defaults.items()):
        variants = [(key, run) for key, run in paired if key[2:] == (prompt_id, seed)]
        reference = default.latents() if variants else None
        for (_, variant, _, _), run in variants:
            columns = {"checkpoint": checkpoint, "variant": variant, "prompt_id": prompt_id, "seed": seed}
            table = _frame_table(run, reference, columns)
            if table is not None:
                parts.append(table)
    if not parts:
        return pd.DataFrame(columns=[*RUN_KEYS, "latent_frame", "block", *FRAME_STATS])
    return pd.concat(parts, ignore_index=True)


def _effects_metadata(checkpoint: str, runs: Mapping, defaults: Mapping, interventions: Mapping[str, list]) -> dict:
    """The tables' provenance: the checkpoint, its model, each variant's edits, every run read."""
    return {
        **provenance("variant_effects"),
        "checkpoint": checkpoint,
        "model_config": next(iter(defaults.values())).meta.get("model_config"),
        "interventions": {variant: list(edits or []) for variant, edits in interventions.items()},
        "sources": [
            {
                "checkpoint": k[0],
                "variant": k[1],
                "prompt_id": k[2],
                "seed": k[3],
                "file": str(run.folders[0]),
                "latents_sha256": run.meta.get("latents_sha256"),
                "device_kind": run.meta.get("device_kind"),
                **({"dtype": run.meta["dtype"]} if "dtype" in run.meta else {}),
            }
            for k, run in sorted(runs.items())
        ],
    }
