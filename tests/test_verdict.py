"""What ``sinkscope check`` says of a study it accepts: one verdict line (runs, jobs,
layers, device, an estimate of the time), the full config only with --show-config (the
variants the study adds among them); the estimate's model against its measurements."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO, Workflow

from sinkscope.cli import main as cli_main
from sinkscope.model import MODEL_CONFIGS
from sinkscope.options import GenerationOptions
from sinkscope.pipeline.durations import SPEEDS, describe_seconds, extraction_seconds, generation_flops
from sinkscope.pipeline.study import load_study
from sinkscope.pipeline.verdict import VERDICT_PARTS, job_counts, verdict

INTERVENTIONS = REPO / "configs" / "interventions.yaml"


def _check(*arguments: str, capsys) -> tuple[int, str, str]:
    status = cli_main(["check", *arguments])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_a_valid_study_gets_one_verdict_line_and_no_config(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text((REPO / "config.yaml").read_text())
    status, out, err = _check(capsys=capsys)
    assert status == 0 and out == ""
    (line,) = err.splitlines()
    study = load_study(yaml.safe_load((REPO / "config.yaml").read_text()))
    seeds, layers = len(study.seeds), len(study.layers)
    assert line.startswith("sinkscope check: config.yaml: valid: ")
    assert f"{seeds} runs (1 checkpoint x 1 variant x 1 prompt x {seeds} seeds)" in line
    # On the CPU one layer a job: a job per seed and layer.
    assert f"{sum(job_counts(study).values())} jobs, {seeds * layers} of them extractions of 1 layer each" in line
    assert f"(layers 0-{layers - 1}: {layers} layers)" in line and "extractions on cpu (float32)" in line
    assert line.endswith("one job at a time (an estimate from the study's size)")


def test_show_config_prints_what_the_rules_read_with_the_variants_the_study_adds(capsys):
    status, out, err = _check("--show-config", str(INTERVENTIONS), capsys=capsys)
    assert status == 0 and len(err.splitlines()) == 1
    shown = yaml.safe_load(out)
    configured = yaml.safe_load(INTERVENTIONS.read_text())["variants"]
    assert "default" not in configured and list(shown["variants"]) == ["default", *configured]
    assert shown["variants"]["default"] == {} and shown["generation"]["num_frames"]
    assert "(default added: the untouched run)" in err


def test_a_study_with_sweeps_says_its_atlas_runs_and_their_time(capsys):
    status, _, err = _check(str(REPO / "configs" / "head-atlas.yaml"), capsys=capsys)
    study = load_study(yaml.safe_load((REPO / "configs" / "head-atlas.yaml").read_text()))
    assert status == 0
    assert "348 runs (1 checkpoint x (1 variant + 115 atlas runs) x 1 prompt x 3 seeds)" in err
    assert "sweeps: 115 runs a prompt and seed (sink_per_head 72, cache_per_frame 18, prune_sink 25), about" in err
    jobs = len(study.extraction_jobs) * 3
    assert f"{jobs} of these of several runs (up to 64 a job, the model loaded once)" in err


def test_the_verdict_is_built_from_its_parts():
    study = load_study({"layers": [0]})
    parts = [part(study) for part in VERDICT_PARTS]
    assert verdict(study, "x.yaml") == "x.yaml: valid: " + "; ".join(part for part in parts if part)


def test_the_time_model_gives_back_its_measurements():
    """The constants of pipeline.durations against what they were measured on."""
    # An H100: one Self-Forcing extraction job of 30 layers, fresh process, 18.5 s.
    wan = MODEL_CONFIGS["wan2.1-t2v-1.3b"]
    options = GenerationOptions.from_config({"num_frames": 21})
    flops = generation_flops(wan, options, captured_layers=30)
    assert 1.4e15 < flops < 2.0e15
    job = extraction_seconds(wan, options, "cuda", captured_layers=30, weight_bytes=5_700_000_000)
    assert 16 < job < 21
    # The 2-core CPU: the demo's job generates its 35 calls in 1.4 s with one layer
    # captured, 2.3 s with six.
    demo, fixed = MODEL_CONFIGS["demo"], SPEEDS["cpu"].start_seconds + SPEEDS["cpu"].load_seconds
    generate = [
        extraction_seconds(demo, options, "cpu", captured_layers=layers, weight_bytes=0) - fixed for layers in (1, 6)
    ]
    assert options.num_calls == 35 and 1.2 < generate[0] < 1.6 and 2.0 < generate[1] < 2.6
    assert [describe_seconds(s) for s in (0.2, 40, 250, 7200, 200000)] == ["1 s", "40 s", "4 min", "2 h", "2.3 days"]


@pytest.mark.workflow
@pytest.mark.slow
@pytest.mark.parametrize("config", ["config.yaml", "configs/interventions.yaml", "configs/head-atlas.yaml"])
def test_the_verdict_counts_the_jobs_snakemake_plans(config, tmp_path):
    raw = yaml.safe_load((REPO / config).read_text())
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(raw))
    planned = Workflow(tmp_path).planned_jobs("--configfile", "study.yaml")
    planned.pop("all")  # the target rule, no work
    counts = job_counts(load_study(raw, base_dir=tmp_path))
    extraction = sum(count for rule, count in planned.items() if rule.startswith(("extract_attention", "extract_runs")))
    assert sum(counts.values()) == sum(planned.values()) and counts["extraction"] == extraction
