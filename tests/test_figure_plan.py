"""Which figures a study draws, and in which jobs (sinkscope.pipeline.figureplan): every
kind for the runs, fewer for the variants paired with the untouched run
(``figures.variant_kinds``), only the kinds ``figures.kinds`` chooses; one job a source,
a layer of a source, a checkpoint, the study; and a job of several figures draws each
byte for byte as a job of one figure does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_figures import study as synthetic_study
from test_figures import write_source

from sinkscope.figures.registry import CHECKPOINT_FIGURES, LAYER_FIGURES, SOURCE_FIGURES, STUDY_FIGURES, SWEEP_FIGURES
from sinkscope.pipeline.configfile import read_config_file
from sinkscope.pipeline.figureplan import CHOOSABLE_FIGURES
from sinkscope.pipeline.study import load_study
from sinkscope.schema import load_schema

VARIANT_DEFAULT = ["figure4", "first_middle_last", "sink_score_overview", "head_classes", "cache_timeline"]


def test_the_schema_offers_exactly_the_registry_kinds():
    figures = load_schema()["properties"]["figures"]["properties"]
    listed = figures["kinds"]["anyOf"][1]["items"]["enum"]
    assert listed == list(CHOOSABLE_FIGURES)
    assert listed == [*SOURCE_FIGURES, *LAYER_FIGURES, *CHECKPOINT_FIGURES, *SWEEP_FIGURES, *STUDY_FIGURES]
    assert figures["variant_kinds"]["items"]["enum"] == [*SOURCE_FIGURES, *LAYER_FIGURES]
    assert figures["variant_kinds"]["default"] == VARIANT_DEFAULT


@pytest.fixture(scope="module")
def interventions():
    return load_study(read_config_file(REPO / "configs" / "interventions.yaml"))


def test_paired_variants_get_the_summary_kinds_and_no_layer_figures(interventions):
    study = interventions
    assert study.effect_variants and "demo" in study.runs
    assert study.figure_kinds("demo") == [k for k in SOURCE_FIGURES if k != "label_agreement"]
    assert study.layer_figure_kinds("demo") == list(LAYER_FIGURES)
    for variant in study.effect_variants:
        source = f"demo@{variant}"
        assert study.figure_kinds(source) == VARIANT_DEFAULT
        assert study.layer_figure_kinds(source) == []
        # The summary page shows, per source, only figures the source draws.
        assert set(study.summary_figures()[source]) <= set(VARIANT_DEFAULT)
    sets = {figure_set.name: figure_set for figure_set in study.source_figure_sets()}
    assert set(sets) == {"run", "variant"} and sets["run"].sources == ("demo",)
    assert set(sets["variant"].sources) == {f"demo@{v}" for v in study.effect_variants}
    assert [figure_set.name for figure_set in study.layer_figure_sets()] == ["layer"]


def test_figures_kinds_chooses_what_is_drawn(tmp_path):
    chosen = ["figure4", "per_head_grid", "sink_mass_over_time", "policy_comparison"]
    study = load_study(
        {
            "layers": [0],
            "generation": {"num_frames": 6},
            "variants": {"window": {"cache_policy": "window", "local_attn_frames": 3}, "global": {}},
            "figures": {"kinds": chosen, "variant_kinds": ["figure4", "per_head_grid"]},
        },
        base_dir=tmp_path,
    )
    drawn = {Path(target).stem for target in study.figure_targets()}
    assert drawn == set(chosen)
    # No default variant: every variant is a run of its own, with every chosen kind.
    assert [figure_set.name for figure_set in study.source_figure_sets()] == ["run"]
    assert study.figure_kinds("demo@window") == ["figure4"]
    assert study.checkpoint_figure_kinds() == ["sink_mass_over_time", "policy_comparison"]


def test_variant_kinds_may_add_layer_figures_to_paired_variants(tmp_path):
    study = load_study(
        {
            "layers": [0],
            "generation": {"num_frames": 6},
            "variants": {"no_sink": {"interventions": [{"edit": "mask_keys", "heads": "all", "key_frames": [0]}]}},
            "figures": {"heads": ["L1H1"], "variant_kinds": ["figure4", "heads_heatmap"]},
        },
        base_dir=tmp_path,
    )
    assert study.figure_kinds("demo@no_sink") == ["figure4"]
    assert study.layer_figure_kinds("demo@no_sink") == ["heads_heatmap"]
    sets = {figure_set.name: (figure_set.kinds, figure_set.layers) for figure_set in study.layer_figure_sets()}
    assert sets == {"layer": (tuple(LAYER_FIGURES), (0,)), "variant_layer": (("heads_heatmap",), (0,))}
    assert set(study.layer_figures("demo@no_sink")) == {"layer0_heads_heatmap"}


_DRAW = """
import json, sys
from sinkscope.figures.render import figure_job, figures_job
jobs = json.loads(sys.argv[1])
if len(jobs) == 1:
    figure_job(**jobs[0], source="demo")
else:
    figures_job(figures={job["kind"] + str(job["layer"]): job for job in jobs}, source="demo")
"""


@pytest.mark.slow
def test_one_process_draws_each_figure_as_its_own_job_does(tmp_path):
    import json

    paths = write_source(tmp_path, synthetic_study("demo"))
    options = {"dpi": 60, "frame_base": 0, "step": "last", "metric": "logit_mean", "heads": ["L1H1", "L5H10"]}
    # Kind, layer, inputs: the same tables read by several figures, and layer figures.
    figures = [
        ("figure4_tokens", None, [paths["token_profiles"], paths["frame_attention"], paths["head_diagnostics"]]),
        ("figure4", None, [paths["frame_attention"], paths["head_diagnostics"]]),
        ("sink_score_overview", None, [paths["frame_attention"], paths["head_diagnostics"]]),
        ("head_classes", None, [paths["head_diagnostics"]]),
        ("sink_mass_over_time", None, [paths["block_stats"]]),
        ("per_head_grid", 4, [*paths["extract"], paths["head_diagnostics"]]),
        ("heads_heatmap", 4, [*paths["extract"], paths["head_diagnostics"]]),
        ("heads_heatmap", 0, [*paths["extract"], paths["head_diagnostics"]]),
    ]

    def jobs(folder: str) -> list[dict]:
        (tmp_path / folder).mkdir()
        return [
            {
                "kind": kind,
                "layer": layer,
                "inputs": inputs,
                "svg": str(tmp_path / folder / f"{kind}{layer}.svg"),
                "png": str(tmp_path / folder / f"{kind}{layer}.png"),
                "options": options,
            }
            for kind, layer, inputs in figures
        ]

    def draw(batch: list[dict]) -> None:
        result = subprocess.run([sys.executable, "-c", _DRAW, json.dumps(batch)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]

    for job in jobs("alone"):
        draw([job])
    draw(jobs("together"))
    for kind, layer, _ in figures:
        for ext in ("svg", "png"):
            alone = (tmp_path / "alone" / f"{kind}{layer}.{ext}").read_bytes()
            assert alone == (tmp_path / "together" / f"{kind}{layer}.{ext}").read_bytes(), (kind, layer, ext)
