"""One study a results folder (sinkscope.pipeline.studystamp): each example config writes
under a folder of its own, a run of another study into a folder that holds one is refused
in one line before anything runs (the first study's files byte-identical afterwards), the
same study with changed layers or figure options is the same study, and
``replace_results`` replaces the recorded study, keeping other studies' folders."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO, Workflow

from sinkscope.errors import SinkscopeError
from sinkscope.pipeline.configfile import read_config_file
from sinkscope.pipeline.invocation import acts_on_results
from sinkscope.pipeline.studystamp import (
    STAMP,
    TOP_FOLDERS,
    claim_results_folder,
    other_study,
    recorded_study,
    study_files,
)


def test_each_example_has_a_folder_of_its_own_and_says_so_in_its_header():
    folders = {}
    for file in sorted((REPO / "configs").glob("*.yaml")):
        folders[file.stem] = read_config_file(file)["results"]
        assert folders[file.stem] == f"results/{file.stem}", file
        header = file.read_text().split("\nresults:", 1)[0]
        assert f"results/{file.stem}/" in header and '"Where results go"' in header, file
    assert read_config_file(REPO / "config.yaml")["results"] == "results"
    assert len(set(folders.values())) == len(folders)
    assert "Where results go" in (REPO / "README.md").read_text()


def test_study_files_are_named_from_the_working_directory(tmp_path):
    (tmp_path / "configs").mkdir()
    assert study_files(["config.yaml"], tmp_path) == ["config.yaml"]
    assert study_files([tmp_path / "configs" / "a.yaml"], tmp_path) == ["configs/a.yaml"]
    assert study_files(["./configs/../configs/a.yaml"], tmp_path) == ["configs/a.yaml"]
    assert study_files(["/elsewhere/b.yaml"], tmp_path) == ["/elsewhere/b.yaml"]


def test_the_first_run_records_its_study_and_the_same_study_runs_again(tmp_path):
    assert other_study("results", ["config.yaml"], workdir=tmp_path) is None
    assert not (tmp_path / "results").exists()  # the check records nothing
    assert claim_results_folder("results", ["config.yaml"], workdir=tmp_path) == []
    assert recorded_study(tmp_path / "results") == ["config.yaml"]
    stamp = (tmp_path / "results" / STAMP).read_text()
    assert other_study("results", ["config.yaml"], workdir=tmp_path) is None
    assert claim_results_folder("results", ["config.yaml"], workdir=tmp_path) == []
    assert (tmp_path / "results" / STAMP).read_text() == stamp


def test_results_without_a_record_are_kept_and_said_when_a_study_claims_them(tmp_path):
    (tmp_path / "results" / "tables").mkdir(parents=True)
    (tmp_path / "results" / "tables" / "frame_attention.parquet").write_bytes(b"old")
    actions = claim_results_folder("results", ["config.yaml"], workdir=tmp_path)
    assert actions == [
        "results/: held results of no recorded study (study.json); kept, and the folder recorded as config.yaml's"
    ]
    assert (tmp_path / "results" / "tables" / "frame_attention.parquet").read_bytes() == b"old"
    assert claim_results_folder("results", ["config.yaml"], workdir=tmp_path) == []  # said once


def test_another_study_is_refused_in_one_line_naming_both_ways_on(tmp_path):
    claim_results_folder("results", ["config.yaml"], workdir=tmp_path)
    with pytest.raises(SinkscopeError) as refused:
        other_study("results", ["configs/mine.yaml"], workdir=tmp_path)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("results/ holds the results of config.yaml, not of configs/mine.yaml")
    assert "--config results=results/<name>" in message and "--config replace_results=true" in message
    with pytest.raises(SinkscopeError, match="not of configs/mine.yaml"):
        claim_results_folder("results", ["configs/mine.yaml"], workdir=tmp_path)
    assert recorded_study(tmp_path / "results") == ["config.yaml"]


def _study_folder(root: Path) -> None:
    for name in TOP_FOLDERS:
        (root / name / "x").mkdir(parents=True)
        (root / name / "x" / "file.parquet").write_bytes(b"old")
    (root / STAMP).write_text(json.dumps({"config_files": ["config.yaml"]}))


def test_replace_results_deletes_the_recorded_study_and_keeps_other_studies(tmp_path):
    results = tmp_path / "results"
    _study_folder(results)
    _study_folder(results / "interventions")  # an example's folder inside the default one
    (results / "interventions" / STAMP).write_text(json.dumps({"config_files": ["configs/interventions.yaml"]}))
    (results / "train-demo").mkdir()
    (results / "train-demo" / "final.pt").write_bytes(b"weights")  # not a study's result
    assert other_study("results", ["other.yaml"], replace=True, workdir=tmp_path) == ["config.yaml"]
    assert (results / "extract" / "x" / "file.parquet").exists()
    # Not while a Snakemake run holds the directory.
    (tmp_path / ".snakemake" / "locks").mkdir(parents=True)
    (tmp_path / ".snakemake" / "locks" / "0.output.lock").write_text("x")
    with pytest.raises(SinkscopeError, match="while a Snakemake run holds this directory"):
        claim_results_folder("results", ["other.yaml"], replace=True, workdir=tmp_path)
    assert (results / "extract" / "x" / "file.parquet").exists()
    (tmp_path / ".snakemake" / "locks" / "0.output.lock").unlink()
    actions = claim_results_folder("results", ["other.yaml"], replace=True, workdir=tmp_path)
    assert len(actions) == 1 and "deleted the results of config.yaml" in actions[0]
    assert recorded_study(results) == ["other.yaml"]
    assert sorted(p.name for p in results.iterdir()) == ["interventions", STAMP, "train-demo"]
    assert recorded_study(results / "interventions") == ["configs/interventions.yaml"]
    assert (results / "interventions" / "figures" / "x" / "file.parquet").read_bytes() == b"old"
    assert (results / "train-demo" / "final.pt").read_bytes() == b"weights"


@pytest.mark.parametrize(
    ("argv", "acts"),
    [
        (["snakemake", "--cores", "1"], True),
        (["snakemake", "-n"], True),
        (["snakemake", "--report", "r.html"], True),
        (["snakemake", "--delete-all-output"], True),
        (["snakemake", "--lint"], False),
        (["snakemake", "--list-rules"], False),
        (["snakemake", "--dag"], False),
    ],
)
def test_which_invocations_must_not_meet_another_study(argv, acts):
    assert acts_on_results(argv) is acts


# -- the real workflow --------------------------------------------------------------------------

TINY = {"layers": [0], "seeds": [0], "generation": {"num_frames": 3}, "capture": {"token_profiles": "none"}}


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (logs and benchmarks too: nothing may change)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.workflow
def test_two_studies_in_one_clone_keep_both_results(tmp_path):
    workflow = Workflow(tmp_path)
    workflow.write_config(TINY)
    workflow.run()
    first = snapshot(tmp_path / "results")
    assert json.loads((tmp_path / "results" / STAMP).read_text())["config_files"] == ["config.yaml"]
    # The same study with another layer and another figure option: the same study.
    same = workflow.run("--dry-run", "--config", "layers=[0,1]", "figures={dpi: 100}")
    assert "holds the results of" not in same.stderr
    # Another config file into the same folder: refused before anything runs, in one line.
    other = {**TINY, "variants": {"no_sink": {"sink_frames": 0}}, "results": "results"}
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    for args in (("--dry-run",), ()):
        refused = workflow.run("--configfile", "other.yaml", *args, check=False)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr
        line = next(line for line in refused.stderr.splitlines() if line.startswith("sinkscope:"))
        assert line == (
            "sinkscope: results/ holds the results of config.yaml, not of other.yaml: to keep both, give this "
            "study another folder (results: results/<name> in other.yaml, or --config results=results/<name>); "
            "to replace them, --config replace_results=true"
        )
        assert snapshot(tmp_path / "results") == first
    # In a folder of its own it runs, and the first study's files stay byte for byte.
    workflow.run("--configfile", "other.yaml", "--config", "results=results/other")
    after = snapshot(tmp_path / "results")
    assert {name: digest for name, digest in after.items() if not name.startswith("other/")} == first
    assert (tmp_path / "results/other/tables/checkpoints/demo@no_sink/head_stats.parquet").is_file()
    assert recorded_study(tmp_path / "results" / "other") == ["other.yaml"]
    assert workflow.planned_jobs() == {}
    assert workflow.planned_jobs("--configfile", "other.yaml", "--config", "results=results/other") == {}
    # Replacing: the first study's results go, the other study's folder inside stays whole.
    kept = snapshot(tmp_path / "results" / "other")
    replaced = workflow.run("--configfile", "other.yaml", "--config", "replace_results=true")
    assert "sinkscope: results/: deleted the results of config.yaml" in replaced.stderr
    assert recorded_study(tmp_path / "results") == ["other.yaml"]
    assert snapshot(tmp_path / "results" / "other") == kept
    assert not (tmp_path / "results/tables/checkpoints/demo").exists()
    assert (tmp_path / "results/tables/checkpoints/demo@no_sink/head_stats.parquet").is_file()
