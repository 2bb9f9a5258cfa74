"""The atlas tables (head_atlas, frame_atlas, pruning_curve) and the pruning runs' head
orders, on small synthetic runs, against brute-force loops over the latents and rows."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pandas as pd
import pytest
from synthetic import synthetic_rows

from sinkscope.errors import SinkscopeError
from sinkscope.interventions import HEAD_ORDERS
from sinkscope.naming import head_label
from sinkscope.pipeline.atlas import (
    default_frame_mass,
    default_head_mass,
    frame_atlas,
    head_atlas,
    pruning_curve,
    run_drift,
)
from sinkscope.pipeline.effects import frame_blocks, frame_effects
from sinkscope.pipeline.headorders import head_orders, random_order
from sinkscope.sweeps import read_head_orders, write_head_orders
from sinkscope.tables import ALL_PROMPTS, ALL_SEEDS, SCHEMAS, read_table, write_table

BLOCKS = (3, 3, 3, 3)  # 12 latent frames
RUNS = (("p", 0), ("p", 1), ("q", 0))
SHAPE = (4, sum(BLOCKS), 2, 3)  # channels, frames, height, width


def latents_of(variant: str, prompt: str, seed: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """(the untouched run's latents, the variant's): the variant moved away after block 0."""
    rng = np.random.default_rng(zlib.crc32(f"{prompt}:{seed}".encode()))
    reference = rng.normal(size=SHAPE).astype(np.float32)
    blocks = frame_blocks(BLOCKS, SHAPE[1])
    own = np.random.default_rng(zlib.crc32(f"{variant}:{prompt}:{seed}".encode()))
    moved = reference + scale * blocks[None, :, None, None] * own.normal(size=SHAPE)
    return reference, moved.astype(np.float32)


def effects_of(variants: dict[str, float], checkpoint: str = "demo") -> tuple[pd.DataFrame, dict]:
    """variant_effects per-run rows of ``variants`` (name -> how far it moves), as the
    effects job writes them, and the latents they came from."""
    parts, latents = [], {}
    for variant, scale in variants.items():
        for prompt, seed in RUNS:
            reference, moved = latents_of(variant, prompt, seed, scale)
            latents[(variant, prompt, seed)] = (reference, moved)
            table = pd.DataFrame(frame_effects(moved, reference))
            table["block"] = frame_blocks(BLOCKS, len(table))
            parts.append(table.assign(checkpoint=checkpoint, variant=variant, prompt_id=prompt, seed=seed))
    return pd.concat(parts, ignore_index=True), latents


def brute_drift(reference: np.ndarray, moved: np.ndarray, frames: list[int]) -> float:
    """The mean over ``frames`` of ||x_f - ref_f|| / ||ref_f||, frame by frame in float64."""
    values = []
    for f in frames:
        a = moved[:, f].astype(np.float64).ravel()
        b = reference[:, f].astype(np.float64).ravel()
        values.append(math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b))) / math.sqrt(sum(y * y for y in b)))
    return sum(values) / len(values) if values else math.nan


LAST = list(range(9, 12))
AFTER0 = list(range(3, 12))


def check_averaged(table: pd.DataFrame, keys: list[str], stats: list[str]) -> None:
    """Each run-averaged row is the mean of its per-run rows, its _run_std their sample std."""
    averaged = table[table["prompt_id"] == ALL_PROMPTS]
    per_run = table[table["prompt_id"] != ALL_PROMPTS]
    assert len(averaged) and (averaged["seed"] == ALL_SEEDS).all() and (per_run["runs"] == 1).all()
    for _, row in averaged.iterrows():
        mine = per_run
        for key in keys:
            mine = mine[mine[key] == row[key]]
        assert row["runs"] == len(mine) == len(RUNS)
        for stat in stats:
            values = [float(v) for v in mine[stat]]
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
            assert row[stat] == pytest.approx(mean, rel=1e-12, abs=1e-15)
            assert row[stat + "_run_std"] == pytest.approx(std, rel=1e-9, abs=1e-15)
            assert per_run[stat + "_run_std"].isna().all()


def test_run_drift_is_the_mean_distance_over_the_last_block_and_after_block_0():
    effects, latents = effects_of({"s/L1H1": 0.1, "s/L2H3": 0.5, "other": 0.2})
    drift = run_drift(effects)
    assert len(drift) == 3 * len(RUNS)
    for row in drift.itertuples(index=False):
        reference, moved = latents[(row.variant, row.prompt_id, row.seed)]
        assert row.drift_last_block == pytest.approx(brute_drift(reference, moved, LAST), rel=1e-9)
        assert row.drift_after_block0 == pytest.approx(brute_drift(reference, moved, AFTER0), rel=1e-9)
    # Run-averaged input rows are not runs.
    averaged = effects.assign(prompt_id=ALL_PROMPTS, seed=ALL_SEEDS)
    assert run_drift(pd.concat([effects, averaged])).equals(drift)


def test_a_variant_that_never_left_block_0_has_no_drift_after_it():
    effects, _ = effects_of({"s/L1H1": 0.3})
    short = effects[effects["block"] == 0]
    drift = run_drift(short)
    assert drift["drift_after_block0"].isna().all() and (drift["drift_last_block"] == 0).all()


def default_rows() -> pd.DataFrame:
    """The untouched run's frame_attention rows: 2 layers x 3 heads, every run."""
    parts = [
        synthetic_rows(seed=i, blocks=BLOCKS, heads=3, layers=(0, 4), checkpoint="demo", prompts=(p,), seeds=(s,))
        for i, (p, s) in enumerate(RUNS)
    ]
    return pd.concat(parts, ignore_index=True)


def test_the_untouched_runs_head_and_frame_mass_against_loops_over_its_rows():
    rows = default_rows()
    edited = rows.assign(variant="s/L1H1", prob_mass=0.0)  # another variant's rows are not the untouched run's
    heads = default_head_mass(pd.concat([rows, edited], ignore_index=True))
    frames = default_frame_mass(pd.concat([rows, edited], ignore_index=True))
    starts = np.cumsum((0, *BLOCKS))
    for (prompt, seed), run in rows.groupby(["prompt_id", "seed"]):
        for (layer, head), own in run.groupby(["layer", "head"]):
            calls = {}
            for r in own.to_dict("records"):
                if r["block"] >= 1:
                    key = (r["block"], r["pass"], r["step"], r["query_frame"])
                    calls[key] = calls.get(key, 0.0) + (r["prob_mass"] if r["key_frame"] == 0 else 0.0)
            expected = sum(calls.values()) / len(calls)
            got = heads[(heads["prompt_id"] == prompt) & (heads["seed"] == seed)]
            got = got[(got["layer"] == layer) & (got["head"] == head)]["frame0_mass_default"]
            assert len(got) == 1 and float(got.iloc[0]) == pytest.approx(expected, rel=1e-6)
        for frame in range(starts[-2]):
            later = [
                r.prob_mass for r in run.itertuples(index=False) if r.key_frame == frame and starts[r.block] > frame
            ]
            got = frames[(frames["prompt_id"] == prompt) & (frames["seed"] == seed) & (frames["key_frame"] == frame)]
            assert float(got["frame_mass_default"].iloc[0]) == pytest.approx(sum(later) / len(later), rel=1e-6)
    assert set(frames["key_frame"]) == set(range(starts[-2]))  # the last block's frames are no later block's keys


def test_head_atlas_per_run_and_run_averaged_against_brute_force(tmp_path):
    swept = {f"heads/{head_label(layer, head)}": 0.05 * (1 + head + layer) for layer in (0, 4) for head in range(3)}
    swept |= {"layers/L1": 0.4, "layers/L5": 0.2, "frames/f3": 0.3, "identity": 0.0, "prune/drift_k2": 0.1}
    effects, latents = effects_of(swept)
    mass = default_head_mass(default_rows())
    classes = {(0, 0): "sink", (0, 1): "local", (4, 2): "sink?"}
    atlas = head_atlas(effects, mass, classes)
    per_run = atlas[atlas["prompt_id"] != ALL_PROMPTS]
    assert set(atlas["sweep"]) == {"heads", "layers"} and set(atlas["variant"]) == {
        v for v in swept if v.startswith(("heads/", "layers/"))
    }
    assert len(per_run) == 8 * len(RUNS) and len(atlas) == 8 * (len(RUNS) + 1)
    for row in per_run.itertuples(index=False):
        reference, moved = latents[(row.variant, row.prompt_id, row.seed)]
        assert row.drift_last_block == pytest.approx(brute_drift(reference, moved, LAST), rel=1e-9)
        assert row.drift_after_block0 == pytest.approx(brute_drift(reference, moved, AFTER0), rel=1e-9)
        run_mass = mass[(mass["prompt_id"] == row.prompt_id) & (mass["seed"] == row.seed)]
        if row.sweep == "heads":
            expected = run_mass[(run_mass["layer"] == row.layer) & (run_mass["head"] == row.head)]
            assert row.frame0_mass_default == pytest.approx(float(expected["frame0_mass_default"].iloc[0]))
            assert row.variant == f"heads/{head_label(row.layer, row.head)}"
        else:
            assert row.head == -1 and row.variant == f"layers/L{row.layer + 1}"
            expected = run_mass[run_mass["layer"] == row.layer]["frame0_mass_default"].mean()
            assert row.frame0_mass_default == pytest.approx(float(expected))
    labels = {(int(a), int(b)): c for a, b, c in zip(atlas["layer"], atlas["head"], atlas["head_class"])}
    assert (
        labels[(0, 0)] == "sink" and labels[(4, 2)] == "sink?" and pd.isna(labels[(0, 2)]) and pd.isna(labels[(0, -1)])
    )
    check_averaged(atlas, ["variant"], ["drift_last_block", "drift_after_block0", "frame0_mass_default"])
    path = tmp_path / "head_atlas.parquet"
    write_table(atlas, path, SCHEMAS["head_atlas"])
    back = read_table(path)
    assert list(back.columns) == SCHEMAS["head_atlas"].names and len(back) == len(atlas)


def test_frame_atlas_per_run_and_run_averaged_against_brute_force():
    swept = {f"frames/f{f}": 0.1 + 0.05 * f for f in (0, 1, 4, 8)} | {"heads/L1H1": 0.2}
    effects, latents = effects_of(swept)
    mass = default_frame_mass(default_rows())
    atlas = frame_atlas(effects, mass, sink_frames=(0, 1))
    per_run = atlas[atlas["prompt_id"] != ALL_PROMPTS]
    assert set(atlas["variant"]) == {v for v in swept if v.startswith("frames/")}
    for row in per_run.itertuples(index=False):
        reference, moved = latents[(row.variant, row.prompt_id, row.seed)]
        block = row.key_frame // 3
        assert row.block == block and row.sink == (row.key_frame in (0, 1))
        assert row.drift_last_block == pytest.approx(brute_drift(reference, moved, LAST), rel=1e-9)
        assert row.drift_after_block0 == pytest.approx(brute_drift(reference, moved, AFTER0), rel=1e-9)
        later = list(range(3 * (block + 1), 12))
        assert row.drift_after_frame == pytest.approx(brute_drift(reference, moved, later), rel=1e-9)
        expected = mass[(mass["prompt_id"] == row.prompt_id) & (mass["seed"] == row.seed)]
        expected = expected[expected["key_frame"] == row.key_frame]["frame_mass_default"]
        assert row.frame_mass_default == pytest.approx(float(expected.iloc[0]))
    check_averaged(
        atlas, ["variant"], ["drift_last_block", "drift_after_block0", "drift_after_frame", "frame_mass_default"]
    )
    averaged = atlas[atlas["prompt_id"] == ALL_PROMPTS]
    assert list(averaged["key_frame"]) == [0, 1, 4, 8] and list(averaged["sink"]) == [True, True, False, False]
    assert SCHEMAS["frame_atlas"].names == list(atlas.columns)


def test_pruning_curve_per_order_and_head_count():
    swept = {f"prune/{order}_k{k}": 0.02 * k * (1 + i) for i, order in enumerate(HEAD_ORDERS) for k in (1, 2)}
    swept |= {"prune/all_k4": 0.5, "heads/L1H1": 0.1}
    effects, latents = effects_of(swept)
    curve = pruning_curve(effects)
    assert SCHEMAS["pruning_curve"].names == list(curve.columns)
    averaged = curve[curve["prompt_id"] == ALL_PROMPTS]
    assert [(o, k) for o, k in zip(averaged["order"], averaged["head_count"])] == [
        *[(o, 1) for o in sorted(HEAD_ORDERS)],
        *[(o, 2) for o in sorted(HEAD_ORDERS)],
        ("all", 4),
    ]
    for row in curve[curve["prompt_id"] != ALL_PROMPTS].itertuples(index=False):
        reference, moved = latents[(row.variant, row.prompt_id, row.seed)]
        assert row.variant == f"prune/{row.order}_k{row.head_count}"
        assert row.drift_last_block == pytest.approx(brute_drift(reference, moved, LAST), rel=1e-9)
    check_averaged(curve, ["variant"], ["drift_last_block", "drift_after_block0"])


def test_head_orders_rank_the_atlas_least_drift_first_and_least_frame0_mass_first(tmp_path):
    rows = []
    drift = {(0, 0): 0.3, (0, 1): 0.1, (1, 0): 0.1, (1, 1): np.nan, (2, 0): 0.05}
    mass = {(0, 0): 0.9, (0, 1): 0.2, (1, 0): 0.5, (1, 1): 0.0, (2, 0): 0.5}
    for (layer, head), value in drift.items():
        rows.append(
            dict(
                checkpoint="demo",
                sweep="heads",
                variant=f"heads/{head_label(layer, head)}",
                prompt_id=ALL_PROMPTS,
                seed=ALL_SEEDS,
                layer=layer,
                head=head,
                drift_last_block=value,
                frame0_mass_default=mass[(layer, head)],
            )
        )
    rows.append(dict(rows[0], prompt_id="p", seed=0, drift_last_block=-1.0))  # per-run rows do not rank
    rows.append(dict(rows[0], sweep="other", drift_last_block=-1.0))
    atlas = pd.DataFrame(rows)
    orders = head_orders(atlas, "heads")
    assert list(orders) == list(HEAD_ORDERS)
    assert orders["drift"] == [(2, 0), (0, 1), (1, 0), (0, 0), (1, 1)]  # ties by (layer, head), NaN last
    assert orders["frame0_mass"] == [(1, 1), (0, 1), (1, 0), (2, 0), (0, 0)]
    assert sorted(orders["random"]) == sorted(drift) and orders["random"] == random_order(sorted(drift), "heads")
    assert random_order(sorted(drift), "heads") != random_order(sorted(drift), "sink_per_head")  # seeded by the atlas
    file = tmp_path / "head_orders.json"
    write_head_orders(file, orders, checkpoint="demo", sweep="heads", runs=3)
    assert read_head_orders(file) == {"heads": orders}
    with pytest.raises(ValueError, match="no run-averaged rows of sweep 'nope'"):
        head_orders(atlas, "nope")
    layers = atlas.assign(head=-1).drop_duplicates(["sweep", "layer", "prompt_id"])
    with pytest.raises(ValueError, match="runs over layers"):
        head_orders(layers, "heads")


def test_a_random_order_is_a_fixed_permutation():
    heads = [(layer, head) for layer in range(30) for head in range(12)]
    order = random_order(heads, "sink_per_head")
    assert sorted(order) == heads and order != heads and order == random_order(list(reversed(heads)), "sink_per_head")
    # Spread over the model: the first 60 heads come from many layers.
    assert len({layer for layer, _ in order[:60]}) >= 20


# -- the jobs, on extraction folders as the extraction job writes them ------------------------------------


def test_atlas_job_and_head_orders_job_on_real_folders(tmp_path):
    """effects_job over a sweep's runs, then atlas_job over its table and the untouched runs'
    folders, then head_orders_job: every number against the latents and rows written."""
    from test_effects import latents_of as latents_for
    from test_effects import run_job, write_run

    from sinkscope.interventions import write_head_classes
    from sinkscope.pipeline.atlas import atlas_job
    from sinkscope.pipeline.headorders import head_orders_job

    variants = ["heads/L4H1", "heads/L4H2", "frames/f1", "frames/f4", "prune/drift_k1", "prune/all_k2"]
    latents, rows, folders, defaults = {}, {}, [], []
    for seed in (0, 1):
        rows[seed] = synthetic_rows(seed=seed)  # layer 3, 2 heads, blocks of 3 frames
        latents[("default", seed)] = latents_for(100 + seed)
        defaults.append(write_run(tmp_path / "x", "default", "p", seed, latents[("default", seed)], rows[seed]))
        for index, variant in enumerate(variants):
            moved = latents[("default", seed)].copy()
            moved[:, 3:] += (index + 1) * 0.05 * latents_for(10 * seed + index)[:, 3:]
            latents[(variant, seed)] = moved
            folders.append(write_run(tmp_path / "x", variant, "p", seed, moved, synthetic_rows(seed=50 + index)))
    effects = run_job(tmp_path, defaults + folders)["variant_effects"]
    effects_file = tmp_path / "variant_effects.parquet"
    classes_file = tmp_path / "head_classes.json"
    write_head_classes(classes_file, {(3, 0): "sink", (3, 1): "local"}, source="ck", call=("denoise", 1))
    outputs = {name: tmp_path / f"{name}.parquet" for name in ("head_atlas", "frame_atlas", "pruning_curve")}
    atlas_job([effects_file, *defaults, classes_file], outputs, {"checkpoint": "ck", "sink_frames": 0})
    tables = {name: read_table(path) for name, path in outputs.items()}
    assert len(effects) and set(tables["head_atlas"]["variant"]) == {"heads/L4H1", "heads/L4H2"}
    for row in tables["head_atlas"][tables["head_atlas"]["prompt_id"] != ALL_PROMPTS].itertuples(index=False):
        reference, moved = latents[("default", row.seed)], latents[(row.variant, row.seed)]
        assert row.drift_last_block == pytest.approx(brute_drift(reference, moved, [6, 7, 8]), rel=1e-9)
        own = rows[row.seed][(rows[row.seed]["head"] == row.head) & (rows[row.seed]["block"] >= 1)]
        calls = own.groupby(["block", "pass", "step", "query_frame"])
        mass = calls.apply(lambda c: c.loc[c["key_frame"] == 0, "prob_mass"].sum()).mean()
        assert row.frame0_mass_default == pytest.approx(mass, rel=1e-6)
        assert row.head_class == {0: "sink", 1: "local"}[row.head]
    frames = tables["frame_atlas"][tables["frame_atlas"]["prompt_id"] == ALL_PROMPTS]
    assert list(frames["key_frame"]) == [1, 4] and list(frames["sink"]) == [False, False]
    curve = tables["pruning_curve"][tables["pruning_curve"]["prompt_id"] == ALL_PROMPTS]
    assert [(o, int(k)) for o, k in zip(curve["order"], curve["head_count"])] == [("drift", 1), ("all", 2)]
    orders_file = tmp_path / "head_orders.json"
    # The orders from the head sweep's runs and the untouched ones (the pruning runs wait for
    # them, so they are not read from head_atlas, whose effects pair the pruning runs too).
    heads = [folder for folder in folders if "heads" in str(folder)]
    head_orders_job(folders=defaults + heads, output=orders_file, checkpoint="ck", sweep="heads")
    orders = read_head_orders(orders_file)["heads"]
    averaged = tables["head_atlas"][tables["head_atlas"]["prompt_id"] == ALL_PROMPTS]
    least = averaged.sort_values("drift_last_block")
    assert orders["drift"] == [(int(a), int(b)) for a, b in zip(least["layer"], least["head"])]
    assert sorted(orders["random"]) == [(3, 0), (3, 1)]
    with pytest.raises(SinkscopeError, match="the atlases read the 'default' runs"):
        atlas_job([effects_file, folders[0]], outputs, {"checkpoint": "ck"})
