"""The real Snakemake DAG on the trained demo model, in a temporary folder: outputs and reruns."""

from __future__ import annotations

import hashlib

import pandas as pd
import pyarrow.parquet as pq
import pytest

from sinkscope.figures.registry import (
    CHECKPOINT_FIGURES,
    FIGURES,
    LABEL_FIGURES,
    LAYER_FIGURES,
    SOURCE_FIGURES,
    STUDY_FIGURES,
    SWITCH_FIGURES,
)
from sinkscope.figures.report import number
from sinkscope.pipeline.study import TABLES
from sinkscope.tables import SCHEMAS, read_metadata
from sinkscope.tokens import token_rows

pytestmark = [pytest.mark.workflow, pytest.mark.slow]

BASE = {"layers": [0, 4], "generation": {"num_frames": 9}}


def without_all(jobs: dict[str, int]) -> dict[str, int]:
    return {rule: n for rule, n in jobs.items() if rule != "all"}


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_full_run_then_only_what_changed(workflow):
    workflow.write_config(BASE)
    workflow.run()

    for name in TABLES:
        path = workflow.path(f"results/tables/{name}.parquet")
        assert pq.read_schema(path).remove_metadata() == SCHEMAS[name], name
        assert read_metadata(path)["columns"]["checkpoint"].startswith("the config's name")
    frame = pd.read_parquet(workflow.path("results/tables/frame_attention.parquet"))
    assert set(frame["layer"]) == {0, 4} and set(frame["variant"]) == {"default"}
    # 3 blocks x 5 calls x 12 heads x 3 query frames x (3, 6, 9) key frames, per layer.
    assert len(frame) == 2 * 5 * 12 * 3 * (3 + 6 + 9)
    sums = frame.groupby(["layer", "block", "pass", "step", "head", "query_frame"])[["prob_mass", "argmax_share"]].sum()
    assert ((sums - 1).abs() < 1e-5).all().all()
    tokens = pd.read_parquet(workflow.path("results/tables/token_profiles.parquet"))
    # A row per call, head and key frame, the frame's 24 tokens as lists; a row a token.
    assert set(tokens["block"]) == {2} and len(tokens) == 2 * 5 * 12 * 9
    assert len(token_rows(tokens)) == 2 * 5 * 12 * 9 * 24
    meta = read_metadata(workflow.path("results/extract/demo/drift/seed0/layers4/layer4.parquet"))
    for key in (
        "package_version",
        "code_digest",
        "config_hash",
        "checkpoint_digest",
        "torch_version",
        "device_name",
        "device_kind",
        "dtype",
        "model_config",
        "frame_grid",
    ):
        assert meta[key] is not None, key
    assert (meta["device_kind"], meta["dtype"], meta["frame_grid"]) == ("cpu", "float32", [4, 6])
    assert workflow.path("results/extract/demo/drift/seed0/layers4/manifest.json").is_file()

    for kind in SOURCE_FIGURES:
        if kind in LABEL_FIGURES:  # drawn only with a reference label file (diagnostics.reference_labels)
            assert not workflow.path(f"results/figures/demo/{kind}.svg").exists()
            continue
        svg = workflow.path(f"results/figures/demo/{kind}.svg").read_text()
        assert "<text" in svg, kind  # editable text, not outlines
        assert workflow.path(f"results/figures/demo/{kind}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # One variant and one checkpoint: the figures that compare them are not drawn.
    for kind in CHECKPOINT_FIGURES:
        drawn = workflow.path(f"results/figures/demo/{kind}.png")
        # policy_comparison and the effects figures compare variants (one here); prompt_switch needs a
        # prompt that switches.
        assert drawn.exists() == (FIGURES[kind].compares != "variants" and kind not in SWITCH_FIGURES), kind
        assert not drawn.exists() or drawn.stat().st_size > 1000
    for kind in STUDY_FIGURES:
        assert not workflow.path(f"results/figures/{kind}.png").exists(), kind
    for layer in (0, 4):
        for kind in LAYER_FIGURES:
            assert workflow.path(f"results/figures/demo/layer{layer}/{kind}.png").stat().st_size > 1000
    assert "L5H10" in workflow.path("results/figures/demo/figure4.svg").read_text()
    assert workflow.path("results/tables/checkpoints/demo/head_classes.csv").read_text().startswith("layer,H1,")
    summary = workflow.path("results/report/summary.html").read_text()
    assert "shipped demo model (trained here, not Self-Forcing)" in summary.split("<h2>")[0]
    assert "<img src='../figures/demo/figure4.svg'" in summary

    # An unchanged rerun does nothing.
    assert without_all(workflow.planned_jobs()) == {}

    # A new layer: only its extraction (layers go one a job on the CPU), then what reads it:
    # the source's layer figures (one job, the new layer's among them).
    first = digest(workflow.path("results/extract/demo/drift/seed0/layers0/layer0.parquet"))
    workflow.write_config({**BASE, "layers": [0, 4, 5]})
    jobs = without_all(workflow.planned_jobs())
    assert jobs["extract_attention"] == 1 and "encode_prompt" not in jobs
    assert jobs["layer_figures"] == 1
    workflow.run()
    assert digest(workflow.path("results/extract/demo/drift/seed0/layers0/layer0.parquet")) == first

    # A figure option reruns only the jobs that draw a figure with it (and the summary, which
    # shows it and some of them); the checkpoint's figures (sink_mass_over_time, sink_collapse)
    # do not draw with the metric.
    workflow.write_config({**BASE, "layers": [0, 4, 5], "figures": {"metric": "prob_mass"}})
    jobs = without_all(workflow.planned_jobs())
    assert set(jobs) == {"run_figures", "layer_figures", "summary_page"}
    workflow.run()
    workflow.write_config({**BASE, "layers": [0, 4, 5], "figures": {"metric": "prob_mass", "heads": ["L1H2"]}})
    # The chosen heads: the source's figures job (figure4 ... attention_over_time draw them);
    # no layer figure draws them, and policy_comparison is not drawn with one variant.
    assert not any(FIGURES[kind].draws_heads for kind in LAYER_FIGURES)
    assert without_all(workflow.planned_jobs()) == {"run_figures": 1, "summary_page": 1}

    # Equivalent configs rerun nothing: 5 for 5.0, a policy's defaults spelled out.
    workflow.write_config(
        {
            **BASE,
            "layers": [0, 4, 5],
            "figures": {"metric": "prob_mass", "heads": ["L1H2"]},
            "generation": {"num_frames": 9, "timestep_shift": 5, "cache_policy": "global"},
        }
    )
    workflow.run("--allowed-rules", "run_figures", "summary_page")
    assert without_all(workflow.planned_jobs()) == {}


def test_variants_are_sources_and_rerun_alone(workflow):
    config = {
        "layers": [1],
        "generation": {"num_frames": 15},
        "variants": {
            "window": {"cache_policy": "window", "local_attn_frames": 6},
            "deep": {"cache_policy": "deep_sink", "local_attn_frames": 7, "sink_frames": 2},
        },
    }
    workflow.write_config(config)
    workflow.run()
    blocks = pd.read_parquet(workflow.path("results/tables/block_stats.parquet"))
    assert set(blocks["variant"]) == {"window", "deep"}
    frame = pd.read_parquet(workflow.path("results/tables/frame_attention.parquet"))
    deep = frame[frame["variant"] == "deep"]
    assert (deep["key_position_shift"] != 0).any() and (
        frame[frame["variant"] == "window"]["key_position_shift"] == 0
    ).all()
    assert workflow.path("results/figures/demo@deep/figure4.svg").is_file()
    assert workflow.path("results/figures/demo/policy_comparison.svg").is_file()
    # Editing one variant reruns its jobs only.
    config["variants"]["deep"]["sink_frames"] = 3
    workflow.write_config(config)
    jobs = without_all(workflow.planned_jobs())
    assert jobs["extract_attention"] == 1 and jobs["aggregate_source"] == 1


def test_figure_table_and_summary_show_the_same_numbers(workflow):
    workflow.write_config({"layers": [0], "generation": {"num_frames": 9}, "seeds": [0, 1]})
    workflow.run()
    heads = pd.read_parquet(workflow.path("results/tables/head_stats.parquet"))
    chosen = heads[
        (heads["prompt_id"] == "*")
        & (heads["pass"] == "denoise")
        & (heads["step"] == 3)
        & (heads["metric"] == "logit_mean")
    ].set_index("head")
    assert (chosen["runs"] == 2).all() and chosen["sink_score_run_std"].notna().all()
    mass = heads[
        (heads["prompt_id"] == "*")
        & (heads["pass"] == "denoise")
        & (heads["step"] == 3)
        & (heads["metric"] == "prob_mass")
    ].set_index("head")
    classes = pd.read_parquet(workflow.path("results/tables/head_diagnostics.parquet"))
    classes = classes[(classes["pass"] == "denoise") & (classes["step"] == 3)].set_index("head")["head_class"]
    grid = workflow.path("results/figures/demo/layer0/per_head_grid.svg").read_text()
    for head, row in mass.iterrows():
        assert f"H{head + 1} · {classes[head]}<" in grid and f"excess {row['frame0_excess']:+.3f}<" in grid
    assert "mean of n = 2 runs" in grid
    layers = pd.read_parquet(workflow.path("results/tables/layer_stats.parquet"))
    row = layers[
        (layers["prompt_id"] == "*")
        & (layers["pass"] == "denoise")
        & (layers["step"] == 3)
        & (layers["metric"] == "logit_mean")
    ].iloc[0]
    summary = workflow.path("results/report/summary.html").read_text()
    assert f"<td>{number(row['sink_score'])} ± {number(row['sink_score_run_std'])}</td>" in summary


def test_attention_across_training_checkpoints(workflow):
    """A few training steps saved along the way, then the study across those checkpoints."""
    from sinkscope.demo.train import train_demo

    train_demo(workflow.path("train"), steps=4, batch_size=2, save_every=2, seed=0, progress=False)
    steps = {
        "untrained": ({"model": "demo", "format": "demo"}, 0),
        "step2": ({"model": "demo", "format": "self_forcing", "weights": "train/checkpoints/step_000002.pt"}, 2),
        "final": ({"model": "demo", "format": "self_forcing", "weights": "train/final.pt"}, 4),
    }
    workflow.write_config(
        {
            "checkpoints": {name: {**entry, "train_step": step} for name, (entry, step) in steps.items()},
            "layers": [0],
            "generation": {"num_frames": 6},
            "capture": {"token_profiles": "none"},
        }
    )
    workflow.run()
    svg = workflow.path("results/figures/attention_across_checkpoints.svg").read_text()
    assert "<text" in svg and "training step" in svg.lower()
    diagnostics = pd.read_parquet(workflow.path("results/tables/head_diagnostics.parquet"))
    assert set(diagnostics["checkpoint"]) == set(steps)
