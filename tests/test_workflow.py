"""The real Snakemake DAG on the demo model, in a temporary folder: outputs and reruns."""

from __future__ import annotations

import hashlib

import pandas as pd
import pyarrow.parquet as pq
import pytest

from sinkscope.tables import FRAME_ATTENTION_SCHEMA, HEAD_STATS_SCHEMA, LAYER_STATS_SCHEMA, read_metadata
from sinkscope.workflow import LAYER_FIGURES, SOURCE_FIGURES

pytestmark = pytest.mark.workflow

BASE = {
    "prompts": {"eagle": "A majestic eagle soaring through a cloudy sky"},
    "seeds": [0],
    "layers": [0, 4],
    "generation": {"num_frames": 9},
}


def without_all(jobs: dict[str, int]) -> dict[str, int]:
    return {rule: n for rule, n in jobs.items() if rule != "all"}


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def jobs_after_one_new_extraction() -> dict[str, int]:
    """The jobs after one new extraction: it, the source's tables, its figures, the rest."""
    return {
        "extract_attention": 1,
        "aggregate_source": 1,
        "combine_tables": 1,
        "source_figure": len(SOURCE_FIGURES),
        "layer_figure": len(LAYER_FIGURES),
        "summary_page": 1,
    }


def test_full_run_then_only_what_changed(workflow):
    workflow.write_config(BASE)
    workflow.run()

    # Every table with the contract's schema and provenance.
    for name, schema in (("frame_attention", FRAME_ATTENTION_SCHEMA), ("head_stats", HEAD_STATS_SCHEMA), ("layer_stats", LAYER_STATS_SCHEMA)):
        path = workflow.path(f"results/tables/{name}.parquet")
        assert pq.read_schema(path).remove_metadata() == schema
    frame = pd.read_parquet(workflow.path("results/tables/frame_attention.parquet"))
    assert set(frame["layer"]) == {0, 4}
    # 3 blocks x 5 calls x 12 heads x 3 query frames x (3, 6, 9) key frames, per layer.
    assert len(frame) == 2 * 5 * 12 * 3 * (3 + 6 + 9)
    sums = frame.groupby(["layer", "block", "pass", "step", "head", "query_frame"])["prob_mass"].sum()
    assert sums.between(1 - 1e-5, 1 + 1e-5).all()
    layer_file = next(workflow.path("results/extract/demo/eagle/seed0").glob("layers4/layer4.parquet"))
    meta = read_metadata(layer_file)
    for key in ("package_version", "config_hash", "checkpoint_digest", "torch_version", "device_name", "model_config"):
        assert meta[key], key
    assert meta["model_config"]["num_heads"] == 12

    for kind in SOURCE_FIGURES:
        svg = workflow.path(f"results/figures/demo/{kind}.svg").read_text()
        assert "<text" in svg and "<path" in svg  # editable text, not outlines
        assert workflow.path(f"results/figures/demo/{kind}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for layer in (0, 4):
        for kind in LAYER_FIGURES:
            assert workflow.path(f"results/figures/demo/layer{layer}/{kind}.png").stat().st_size > 1000
    assert "L5H10" in workflow.path("results/figures/demo/figure4.svg").read_text()
    assert "Strongest sink heads" in workflow.path("results/report/summary.html").read_text()

    # An unchanged rerun does nothing.
    assert without_all(workflow.planned_jobs()) == {}

    # A new layer: only its extraction, then aggregation and figures.
    first_extract = digest(workflow.path("results/extract/demo/eagle/seed0/layers0/layer0.parquet"))
    workflow.write_config({**BASE, "layers": [0, 4, 5]})
    assert without_all(workflow.planned_jobs()) == jobs_after_one_new_extraction()
    workflow.run()
    assert digest(workflow.path("results/extract/demo/eagle/seed0/layers0/layer0.parquet")) == first_extract

    # A figure option reruns figures only (and the summary page, which shows the same view).
    workflow.write_config({**BASE, "layers": [0, 4, 5], "figures": {"metric": "prob_mass"}})
    jobs = without_all(workflow.planned_jobs())
    assert set(jobs) == {"source_figure", "layer_figure", "summary_page"}
    workflow.run()

    # The Figure 4 heads touch only the Figure 4 panel.
    workflow.write_config({**BASE, "layers": [0, 4, 5], "figures": {"metric": "prob_mass", "heads": ["L1H2"]}})
    assert without_all(workflow.planned_jobs()) == {"source_figure": 1}
    workflow.run()

    # A new prompt and a new seed: only their extraction jobs (one per layer), their
    # prompt embedding, then aggregation and figures.
    config = {**BASE, "layers": [0, 4, 5], "figures": {"metric": "prob_mass", "heads": ["L1H2"]},
              "prompts": {**BASE["prompts"], "city": "A neon city street at night, rain"}, "seeds": [0, 7]}  # fmt: skip
    workflow.write_config(config)
    jobs = without_all(workflow.planned_jobs())
    # (city, 0), (eagle, 7), (city, 7) x 3 layers, and one new prompt embedding.
    assert jobs["extract_attention"] == 9 and jobs["encode_prompt"] == 1


def test_new_checkpoint_runs_only_its_jobs(workflow):
    config = {**BASE, "layers": [1]}
    workflow.write_config(config)
    workflow.run()
    config["checkpoints"] = {"demo": {"model": "demo", "format": "demo"}, "demo_b": {"model": "demo", "format": "demo", "seed": 5}}
    workflow.write_config(config)
    assert without_all(workflow.planned_jobs()) == jobs_after_one_new_extraction()
    workflow.run()
    frame = pd.read_parquet(workflow.path("results/tables/head_stats.parquet"))
    assert set(frame["checkpoint"]) == {"demo", "demo_b"}
    # Different weights, different attention.
    a = frame[frame["checkpoint"] == "demo"]["sink_score"].to_numpy()
    b = frame[frame["checkpoint"] == "demo_b"]["sink_score"].to_numpy()
    assert a.shape == b.shape and not (a == b).all()


def test_layers_per_job_groups_layers_in_one_generation(workflow):
    workflow.write_config({**BASE, "layers": [0, 1, 4], "layers_per_job": 2})
    assert without_all(workflow.planned_jobs())["extract_attention"] == 2  # layers {0, 1} and {4}
    workflow.run()
    files = sorted(p.relative_to(workflow.path("results/extract")).as_posix() for p in workflow.path("results/extract").rglob("*.parquet"))
    assert files == ["demo/eagle/seed0/layers0-1/layer0.parquet", "demo/eagle/seed0/layers0-1/layer1.parquet",
                     "demo/eagle/seed0/layers4/layer4.parquet"]  # fmt: skip
    # One generation, two layers: the same video (same latents) for both files.
    meta0 = read_metadata(workflow.path("results/extract/demo/eagle/seed0/layers0-1/layer0.parquet"))
    meta1 = read_metadata(workflow.path("results/extract/demo/eagle/seed0/layers0-1/layer1.parquet"))
    meta4 = read_metadata(workflow.path("results/extract/demo/eagle/seed0/layers4/layer4.parquet"))
    assert meta0["layers_in_job"] == [0, 1] and meta0["latents_sha256"] == meta1["latents_sha256"] == meta4["latents_sha256"]
    # Adding layer 5 reruns only the job of its block of layers.
    workflow.write_config({**BASE, "layers": [0, 1, 4, 5], "layers_per_job": 2})
    assert without_all(workflow.planned_jobs())["extract_attention"] == 1
