"""Paired variant effects (sinkscope.pipeline.effects): latents kept in the extraction
folder, each variant against its untouched default run, per latent frame and per head,
checked against plain numpy on real file layouts; and the demo study with three edits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from synthetic import synthetic_rows

from sinkscope.errors import DamagedFileError, SinkscopeError
from sinkscope.manifests import write_manifest
from sinkscope.naming import layer_file
from sinkscope.pipeline.effects import call_values, edited_heads, effects_job, frame_effects, head_effects
from sinkscope.pipeline.latents import LATENTS_FILE, latents_sha256, read_latents, write_latents
from sinkscope.tables import ALL_PROMPTS, ALL_SEEDS, SCHEMAS, read_metadata, read_table, write_table

NUM_LAYERS, NUM_HEADS = 6, 4


# -- real file layouts ---------------------------------------------------------------------------


def queries_of(frames: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    keys = [c for c in SCHEMAS["query_stats"].names if c in frames.columns]
    rows = frames.groupby(keys, observed=True).size().rename("num_key_frames").reset_index()
    return rows.assign(entropy_tokens=rng.random(len(rows)) + 2.0, num_keys=rows["num_key_frames"] * 24)


def write_run(
    root: Path,
    variant: str,
    prompt: str,
    seed: int,
    latents: np.ndarray,
    frames: pd.DataFrame,
    layers=(3,),
    block_sizes=(3, 3, 3),
    queries: pd.DataFrame | None = None,
) -> Path:
    """One extraction folder as the extraction job writes it: per layer frame and query
    files (with the run's metadata), the latents, and the manifest listing them."""
    source = "ck" if variant == "default" else f"ck@{variant}"
    folder = root / source / prompt / f"seed{seed}" / f"layers{'_'.join(map(str, layers))}"
    folder.mkdir(parents=True)
    frames = frames.assign(checkpoint="ck", variant=variant, prompt_id=prompt, seed=seed)
    queries = queries_of(frames, np.random.default_rng(seed)) if queries is None else queries
    meta = {
        "checkpoint": "ck",
        "variant": variant,
        "prompt_id": prompt,
        "seed": seed,
        "block_sizes": list(block_sizes),
        "latents_sha256": latents_sha256(latents),
        "model_config": {"num_layers": NUM_LAYERS, "num_heads": NUM_HEADS},
        "dtype": "float32",
        "device_kind": "cpu",
    }
    written, counts = [], {}
    for layer in layers:
        for kind, rows in (("frames", frames), ("queries", queries)):
            path = Path(layer_file(folder, layer, kind))
            part = rows[rows["layer"] == layer]
            write_table(
                part, path, SCHEMAS["frame_attention" if kind == "frames" else "query_stats"], {**meta, "layer": layer}
            )
            written.append(path.name)
            counts[path.name] = len(part)
    written.append(write_latents(folder, latents))
    write_manifest(folder, written, {"layers": list(layers), "rows": counts, "num_calls": 9, "num_heads": 2})
    return folder


def latents_of(seed: int, frames: int = 9) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(4, frames, 3, 5)).astype(np.float32)


def run_job(root: Path, folders, interventions=None, extra=()) -> dict[str, pd.DataFrame]:
    outputs = {name: root / f"{name}.parquet" for name in ("variant_effects", "variant_head_effects")}
    effects_job(
        [*map(str, folders), *map(str, extra)], outputs, {"checkpoint": "ck", "interventions": interventions or {}}
    )
    return {name: read_table(path) for name, path in outputs.items()}


# -- the latents file ------------------------------------------------------------------------------


def test_latents_file_holds_the_rows_latents_and_refuses_damage(tmp_path):
    latents = latents_of(0)
    assert write_latents(tmp_path, latents) == LATENTS_FILE
    first = (tmp_path / LATENTS_FILE).read_bytes()
    write_latents(tmp_path, latents)
    assert (tmp_path / LATENTS_FILE).read_bytes() == first  # the same latents, the same bytes
    # The sha256 the extraction's rows carry (latents_sha256 of the [1, C, F, H, W] video) is the file's.
    video_sha = __import__("hashlib").sha256(latents[None].tobytes()).hexdigest()
    np.testing.assert_array_equal(read_latents(tmp_path, video_sha), latents)
    with pytest.raises(DamagedFileError, match="other latents"):
        read_latents(tmp_path, "0" * 64)
    data = bytearray(first)
    data[-3] ^= 0xFF
    (tmp_path / LATENTS_FILE).write_bytes(bytes(data))
    with pytest.raises(DamagedFileError, match="do not match") as error:
        read_latents(tmp_path)
    assert error.value.path == str(tmp_path)  # the folder: the extraction job's output, rebuilt whole
    with pytest.raises(DamagedFileError, match="has no latents"):
        read_latents(tmp_path / "elsewhere")


# -- the math against plain numpy -----------------------------------------------------------------


def plain_effects(x: np.ndarray, ref: np.ndarray) -> dict[str, list[float]]:
    """Frame by frame with explicit loops, float64."""
    out: dict[str, list[float]] = {k: [] for k in ("dist", "cos", "flicker", "ffs", "ffs_default")}
    count = min(x.shape[1], ref.shape[1])

    def cos(a, b):
        return float(np.dot(a, b) / (np.sqrt(np.dot(a, a)) * np.sqrt(np.dot(b, b))))

    for f in range(count):
        a, b = x[:, f].astype(np.float64).ravel(), ref[:, f].astype(np.float64).ravel()
        out["dist"].append(float(np.sqrt(((a - b) ** 2).sum()) / np.sqrt((b**2).sum())))
        out["cos"].append(cos(a, b))
        if f == 0:
            out["flicker"].append(np.nan)
        else:
            pa, pb = x[:, f - 1].astype(np.float64).ravel(), ref[:, f - 1].astype(np.float64).ravel()
            out["flicker"].append(float(np.sqrt(((a - pa) ** 2).sum()) / np.sqrt(((b - pb) ** 2).sum())))
        out["ffs"].append(cos(a, x[:, 0].astype(np.float64).ravel()))
        out["ffs_default"].append(cos(b, ref[:, 0].astype(np.float64).ravel()))
    return out


def test_frame_effects_match_plain_numpy_on_latents_files(tmp_path):
    ref = latents_of(1)
    moved = ref + 0.3 * latents_of(2)
    write_latents(tmp_path / "a", moved)
    write_latents(tmp_path / "b", ref)
    got = frame_effects(read_latents(tmp_path / "a"), read_latents(tmp_path / "b"))
    want = plain_effects(moved, ref)
    np.testing.assert_allclose(got["latent_rel_distance"], want["dist"], rtol=1e-12)
    np.testing.assert_allclose(got["latent_cosine"], want["cos"], rtol=1e-12)
    np.testing.assert_allclose(got["flicker"], want["flicker"], rtol=1e-12)
    np.testing.assert_allclose(got["first_frame_similarity"], want["ffs"], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got["first_frame_similarity_default"], want["ffs_default"], rtol=1e-12, atol=1e-15)
    same = frame_effects(ref, ref)  # the identity: exactly 0 and exactly 1, no rounding
    assert (same["latent_rel_distance"] == 0).all() and (same["latent_cosine"] == 1).all()
    assert np.isnan(same["flicker"][0]) and (same["flicker"][1:] == 1).all()


def test_a_longer_or_shorter_video_is_paired_over_the_frames_both_have(tmp_path):
    ref, short = latents_of(3, frames=12), latents_of(4, frames=9)
    got = frame_effects(short, ref)
    assert list(got["latent_frame"]) == list(range(9))
    np.testing.assert_allclose(got["latent_rel_distance"], plain_effects(short, ref)["dist"], rtol=1e-12)
    # Through the job: a 12-frame default (4 blocks) and a 9-frame variant; the block is the variant's.
    rows12 = synthetic_rows(blocks=(3, 3, 3, 3))
    rows9 = synthetic_rows(seed=1, blocks=(3, 3, 3))
    folders = [
        write_run(tmp_path / "x", "default", "p", 0, ref, rows12, block_sizes=(3, 3, 3, 3)),
        write_run(tmp_path / "x", "short", "p", 0, short, rows9),
    ]
    tables = run_job(tmp_path, folders)
    per_run = tables["variant_effects"][tables["variant_effects"]["seed"] == 0]
    assert list(per_run["latent_frame"]) == list(range(9)) and list(per_run["block"]) == [0] * 3 + [1] * 3 + [2] * 3
    np.testing.assert_allclose(per_run["latent_rel_distance"], plain_effects(short, ref)["dist"], rtol=1e-12)
    heads = tables["variant_head_effects"]
    # Head effects: the calls of blocks 1 and 2, which both runs make (3 query frames x 3 calls each).
    assert set(heads.loc[heads["seed"] == 0, "calls"]) == {2 * 3 * 3}


def test_seed_spread_is_the_std_between_runs_as_in_the_other_tables(tmp_path):
    folders = []
    for seed in (0, 1, 2):
        ref = latents_of(10 + seed)
        folders.append(write_run(tmp_path / "x", "default", "p", seed, ref, synthetic_rows(seed=seed)))
        folders.append(
            write_run(
                tmp_path / "x",
                "edit",
                "p",
                seed,
                ref + (seed + 1) * 0.1 * latents_of(20 + seed),
                synthetic_rows(seed=seed + 5),
            )
        )
    tables = run_job(tmp_path, folders)
    for name, keys, stat in (
        ("variant_effects", ["latent_frame"], "latent_rel_distance"),
        ("variant_head_effects", ["layer", "head"], "frame0_mass_change"),
    ):
        table = tables[name]
        runs = table[table["prompt_id"] != ALL_PROMPTS]
        averaged = table[table["prompt_id"] == ALL_PROMPTS].set_index(keys)
        assert (averaged["seed"] == ALL_SEEDS).all() and (averaged["runs"] == 3).all() and (runs["runs"] == 1).all()
        assert runs[stat + "_run_std"].isna().all()
        grouped = runs.groupby(keys)[stat]
        np.testing.assert_allclose(averaged[stat], grouped.mean().reindex(averaged.index), rtol=1e-12)
        np.testing.assert_allclose(
            averaged[stat + "_run_std"].dropna(), grouped.std(ddof=1).reindex(averaged.index).dropna(), rtol=1e-12
        )
    frame0 = tables["variant_effects"].query("prompt_id == '*' and latent_frame == 0")
    assert np.isnan(frame0["flicker"]).all()  # no previous frame


# -- head effects --------------------------------------------------------------------------------


def test_head_effects_match_calls_by_block_pass_step_and_query_frame():
    default = synthetic_rows(seed=0, heads=2, steps=2)
    variant = synthetic_rows(seed=1, heads=2, steps=2)
    # The variant has one call more (a re-cache pass of block 2) and lacks the cache pass of block 1;
    # its block 2 lost frame 0 (evicted): 0 mass there.
    extra = variant[(variant["block"] == 2) & (variant["pass"] == "cache")].assign(**{"pass": "recache", "step": 0})
    variant = pd.concat([variant[~((variant["block"] == 1) & (variant["pass"] == "cache"))], extra], ignore_index=True)
    variant = variant[~((variant["block"] == 2) & (variant["key_frame"] == 0))]
    rng = np.random.default_rng(0)
    got = head_effects(call_values(variant, queries_of(variant, rng)), call_values(default, queries_of(default, rng)))
    # Plain pandas: frame 0's mass per (call, query frame), calls after block 0 present in both.
    keys = ["layer", "head", "block", "pass", "step", "query_frame"]

    def per_call(rows):
        rows = rows[rows["block"] >= 1]
        mass = rows.assign(m=rows["prob_mass"].where(rows["key_frame"] == 0, 0.0)).groupby(keys)["m"].sum()
        return mass

    both = pd.concat([per_call(variant).rename("v"), per_call(default).rename("d")], axis=1, join="inner")
    assert len(both) == 2 * (3 * 3 + 3 * 2)  # heads x (block 2's three calls + block 1's two) x 3 query frames
    want = (both["v"] - both["d"]).groupby(level=["layer", "head"]).mean()
    np.testing.assert_allclose(got.set_index(["layer", "head"])["frame0_mass_change"], want, rtol=1e-12)
    assert set(got["calls"]) == {len(both) // 2}
    np.testing.assert_allclose(got["frame0_mass"] - got["frame0_mass_default"], got["frame0_mass_change"], atol=1e-12)
    same = head_effects(call_values(default, None), call_values(default, None))
    assert (same["frame0_mass_change"] == 0).all() and same["entropy_tokens_change"].isna().all()


def test_edited_flags_the_heads_of_mask_keys_and_logit_bias_edits(tmp_path):
    where = "variants.x.interventions"
    assert edited_heads([{"edit": "mask_keys", "heads": ["L1H1", "L5H3"], "key_frames": [0]}], where, 6, 4) == {
        (0, 0),
        (4, 2),
    }
    assert edited_heads([{"edit": "logit_bias", "heads": "L2", "key_frames": "sink", "bias": 1.0}], where, 6, 4) == {
        (1, h) for h in range(4)
    }
    assert (
        len(edited_heads([{"edit": "logit_bias", "heads": "all", "key_frames": [0], "bias": 0.0}], where, 6, 4)) == 24
    )
    assert edited_heads([{"edit": "quantize_cache", "format": "int8", "tensors": "both"}], where, 6, 4) == frozenset()
    classes = {(0, 1): "sink", (3, 2): "sink", (3, 3): "local"}
    assert edited_heads([{"edit": "mask_keys", "heads": "class:sink", "key_frames": [0]}], where, 6, 4, classes) == {
        (0, 1),
        (3, 2),
    }
    # Through the job: the flag on the rows of the captured layer (3), run-averaged rows too.
    folders = [
        write_run(tmp_path / "x", "default", "p", 0, latents_of(0), synthetic_rows(seed=0)),
        write_run(tmp_path / "x", "masked", "p", 0, latents_of(1), synthetic_rows(seed=1)),
        write_run(tmp_path / "x", "by_class", "p", 0, latents_of(2), synthetic_rows(seed=2)),
        write_run(tmp_path / "x", "int8", "p", 0, latents_of(3), synthetic_rows(seed=3)),
    ]
    interventions = {
        "masked": [{"edit": "mask_keys", "heads": ["L4H2", "L1H1"], "key_frames": [0]}],
        "by_class": [{"edit": "logit_bias", "heads": "class:sink", "key_frames": [0], "bias": -2.0}],
        "int8": [{"edit": "quantize_cache", "format": "int8", "tensors": "both"}],
    }
    classes_file = tmp_path / "head_classes.json"
    from sinkscope.interventions import write_head_classes

    write_head_classes(classes_file, {(3, 0): "sink", (3, 1): "local"}, source="ck", call=("denoise", 1))
    with pytest.raises(SinkscopeError, match="class"):
        run_job(tmp_path, folders, interventions)
    heads = run_job(tmp_path, folders, interventions, extra=[classes_file])["variant_head_effects"]
    flagged = {(v, int(h)) for v, h, e in zip(heads["variant"], heads["head"], heads["edited"]) if e}
    assert flagged == {("masked", 1), ("by_class", 0)}
    assert set(heads["layer"]) == {3} and len(heads) == 2 * 3 * 2  # per run and run-averaged, 3 variants, 2 heads


def test_identity_and_block_0_are_exactly_zero_and_files_carry_provenance(tmp_path):
    ref, rows = latents_of(5), synthetic_rows(seed=0)
    moved = ref.copy()
    moved[:, 3:] += 0.1  # an edit changes the frames after block 0 only
    folders = [
        write_run(tmp_path / "x", "default", "p", 0, ref, rows),
        write_run(tmp_path / "x", "identity", "p", 0, ref.copy(), rows),
        write_run(tmp_path / "x", "edit", "p", 0, moved, rows),
    ]
    tables = run_job(tmp_path, folders)
    effects = tables["variant_effects"]
    identity = effects[effects["variant"] == "identity"]
    assert (identity["latent_rel_distance"] == 0).all() and (identity["latent_cosine"] == 1).all()
    edit = effects[(effects["variant"] == "edit") & (effects["seed"] == 0)]
    assert (edit.loc[edit["block"] == 0, "latent_rel_distance"] == 0).all()
    assert (edit.loc[edit["block"] > 0, "latent_rel_distance"] > 0).all()
    assert (tables["variant_head_effects"]["frame0_mass_change"] == 0).all()  # the same rows
    meta = read_metadata(tmp_path / "variant_effects.parquet")
    assert meta["checkpoint"] == "ck" and {s["variant"] for s in meta["sources"]} == {"default", "identity", "edit"}
    assert "latent_rel_distance" in meta["columns"]


def test_a_variant_without_its_default_run_or_latents_is_refused(tmp_path):
    folders = [
        write_run(tmp_path / "x", "default", "p", 0, latents_of(0), synthetic_rows()),
        write_run(tmp_path / "x", "edit", "p", 1, latents_of(1), synthetic_rows()),
    ]
    with pytest.raises(SinkscopeError, match="no 'default' run of prompt 'p', seed 1"):
        run_job(tmp_path, folders)
    (folders[0] / LATENTS_FILE).unlink()
    manifest = json.loads((folders[0] / "manifest.json").read_text())
    assert LATENTS_FILE in manifest["files"]  # listed like the other files of the folder
    with pytest.raises(DamagedFileError, match="has no latents") as error:
        run_job(tmp_path, folders[:1] + [write_run(tmp_path / "y", "edit", "p", 0, latents_of(1), synthetic_rows())])
    assert error.value.path == str(folders[0])


def test_damaged_latents_fail_the_job_naming_the_folder_and_keep_the_tables(tmp_path):
    folders = [
        write_run(tmp_path / "x", "default", "p", 0, latents_of(0), synthetic_rows()),
        write_run(tmp_path / "x", "edit", "p", 0, latents_of(1), synthetic_rows(seed=1)),
    ]
    run_job(tmp_path, folders)
    before = {name: (tmp_path / f"{name}.parquet").read_bytes() for name in ("variant_effects", "variant_head_effects")}
    path = folders[1] / LATENTS_FILE
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedFileError, match="latents.safetensors is damaged") as error:
        run_job(tmp_path, folders)
    assert error.value.path == str(folders[1])  # moved aside whole by the job wrapper, rebuilt by the next run
    assert {name: (tmp_path / f"{name}.parquet").read_bytes() for name in before} == before


# -- the plan --------------------------------------------------------------------------------------


def test_effects_are_planned_only_with_a_default_variant_and_another():
    from sinkscope.pipeline.config import normalize_config
    from sinkscope.pipeline.study import Study

    edits = Study(normalize_config({"layers": [0, 4], "seeds": [0, 1], "variants": EDITED_VARIANTS}))
    targets = edits.all_targets()
    for table in ("variant_effects", "variant_head_effects"):
        assert (
            f"results/tables/{table}.parquet" in targets
            and f"results/tables/checkpoints/demo/{table}.parquet" in targets
        )
    assert {"results/figures/demo/variant_drift.svg", "results/figures/demo/attention_shift.png"} <= set(targets)
    assert edits.summary_figures()["demo"]["variant_drift"] == "results/figures/demo/variant_drift.svg"
    assert edits.figure_inputs("attention_shift", "demo") == [
        "results/tables/checkpoints/demo/variant_head_effects.parquet"
    ]
    inputs = edits.effects_inputs("demo")
    assert len(inputs) == 4 * 2 * len(edits.layer_groups) and inputs[0].startswith("results/extract/demo/drift/seed0/")
    params = edits.effects_params("demo")
    assert params["checkpoint"] == "demo" and set(params["interventions"]) == {"identity", "no_sink", "kv_int8"}
    assert params["interventions"]["no_sink"][0]["edit"] == "mask_keys"
    # Variants without a default (policies compared with each other): nothing to pair with.
    policies = Study(
        normalize_config(
            {
                "variants": {
                    "window": {"cache_policy": "window", "local_attn_frames": 6},
                    "global": {"cache_policy": "global"},
                }
            }
        )
    )
    assert policies.effect_variants == [] and not any(
        "effects" in t or "variant_drift" in t for t in policies.all_targets()
    )
    assert Study(normalize_config({})).effect_variants == []


# -- the demo study with three edits ---------------------------------------------------------------

EDITED_VARIANTS = {
    "default": {},
    "identity": {"interventions": [{"edit": "logit_bias", "heads": "all", "key_frames": [0], "bias": 0.0}]},
    "no_sink": {"interventions": [{"edit": "mask_keys", "heads": ["L1H1", "L5H10"], "key_frames": [0]}]},
    "kv_int8": {"interventions": [{"edit": "quantize_cache", "format": "int8", "tensors": "both"}]},
}


@pytest.mark.slow
@pytest.mark.workflow
def test_demo_study_with_three_edits_gives_effects_tables_and_figures(workflow):
    workflow.write_config(
        {
            "layers": [0, 4],
            "seeds": [0, 1],
            "generation": {"num_frames": 9},
            "capture": {"token_profiles": "none"},
            "variants": EDITED_VARIANTS,
        }
    )
    workflow.run()
    effects = pd.read_parquet(workflow.path("results/tables/variant_effects.parquet"))
    heads = pd.read_parquet(workflow.path("results/tables/variant_head_effects.parquet"))
    assert set(effects["variant"]) == set(heads["variant"]) == {"identity", "no_sink", "kv_int8"}
    per_run = effects[effects["seed"] >= 0]
    assert len(per_run) == 3 * 2 * 9 and set(heads["layer"]) == {0, 4}
    identity = effects[effects["variant"] == "identity"]
    assert (identity["latent_rel_distance"] == 0).all() and (identity["latent_cosine"] == 1).all()
    assert (heads.loc[heads["variant"] == "identity", ["frame0_mass_change", "entropy_tokens_change"]] == 0).all().all()
    assert (per_run.loc[per_run["block"] == 0, "latent_rel_distance"] == 0).all()
    int8 = per_run[(per_run["variant"] == "kv_int8") & (per_run["block"] > 0)]
    assert (int8["latent_rel_distance"] > 0).all()
    no_sink = heads[(heads["variant"] == "no_sink") & (heads["seed"] >= 0)].set_index(["seed", "layer", "head"])
    for seed in (0, 1):
        assert no_sink.loc[(seed, 0, 0), "frame0_mass"] == 0 and no_sink.loc[(seed, 4, 9), "frame0_mass"] == 0
    assert set(
        map(tuple, no_sink[no_sink["edited"]].reset_index()[["layer", "head"]].drop_duplicates().to_numpy())
    ) == {(0, 0), (4, 9)}
    averaged = effects[effects["prompt_id"] == ALL_PROMPTS]
    assert (averaged["runs"] == 2).all() and averaged["latent_rel_distance_run_std"].notna().any()
    for kind in ("variant_drift", "attention_shift"):
        svg = workflow.path(f"results/figures/demo/{kind}.svg").read_text()
        assert "<text" in svg and "</svg>" in svg
        assert workflow.path(f"results/figures/demo/{kind}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "variant_drift.svg" in workflow.path("results/report/summary.html").read_text()
    manifest = json.loads(workflow.path("results/extract/demo@kv_int8/drift/seed0/layers0/manifest.json").read_text())
    assert LATENTS_FILE in manifest["files"]
    meta = read_metadata(workflow.path("results/extract/demo@kv_int8/drift/seed0/layers0/layer0.parquet"))
    latents = read_latents(workflow.path("results/extract/demo@kv_int8/drift/seed0/layers0"), meta["latents_sha256"])
    assert latents.shape[1] == 9
    # Editing one variant reruns its extraction, the effects and what draws them, not the others.
    workflow.write_config(
        {
            "layers": [0, 4],
            "seeds": [0, 1],
            "generation": {"num_frames": 9},
            "capture": {"token_profiles": "none"},
            "variants": {
                **EDITED_VARIANTS,
                "kv_int8": {"interventions": [{"edit": "quantize_cache", "format": "int4", "tensors": "both"}]},
            },
        }
    )
    jobs = workflow.planned_jobs()
    assert jobs.get("variant_effects") == 1 and jobs.get("combine_effects") == 1
    assert jobs.get("extract_attention") == 2 * 2  # kv_int8's: seeds x layer groups (one layer a job on the CPU)


def test_atlas_selections_flag_the_first_k_heads_of_the_atlas_order(tmp_path):
    """A pruning run's edits (atlas:<sweep>:<order>:<k>) name the first k heads of the
    atlas's order in its head orders file, which the job takes beside the head classes."""
    from sinkscope.interventions import write_head_classes
    from sinkscope.sweeps import write_head_orders

    folders = [
        write_run(tmp_path / "x", "default", "p", 0, latents_of(0), synthetic_rows(seed=0)),
        write_run(tmp_path / "x", "prune/drift_k1", "p", 0, latents_of(1), synthetic_rows(seed=1)),
        write_run(tmp_path / "x", "by_class", "p", 0, latents_of(2), synthetic_rows(seed=2)),
    ]
    interventions = {
        "prune/drift_k1": [{"edit": "mask_keys", "heads": "atlas:heads:drift:1", "key_frames": "cached"}],
        "by_class": [{"edit": "mask_keys", "heads": "class:sink", "key_frames": [0]}],
    }
    orders = {"drift": [(3, 1), (3, 0)], "random": [(3, 0), (3, 1)], "frame0_mass": [(3, 0), (3, 1)]}
    orders_file, classes_file = tmp_path / "head_orders.json", tmp_path / "head_classes.json"
    write_head_orders(orders_file, orders, checkpoint="ck", sweep="heads", runs=1)
    write_head_classes(classes_file, {(3, 0): "sink", (3, 1): "local"}, source="ck", call=("denoise", 1))
    with pytest.raises(SinkscopeError, match="head atlas 'heads' \\(atlas:\\), and no head orders file"):
        run_job(tmp_path, folders, interventions, extra=[classes_file])
    heads = run_job(tmp_path, folders, interventions, extra=[orders_file, classes_file])["variant_head_effects"]
    flagged = {(v, int(h)) for v, h, e in zip(heads["variant"], heads["head"], heads["edited"]) if e}
    assert flagged == {("prune/drift_k1", 1), ("by_class", 0)}
