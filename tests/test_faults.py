"""Faults: damaged, deleted or mistyped inputs fail naming the culprit, and earlier results survive.

Each test runs the real Snakemake DAG on the demo model in a temporary folder, damages
or mistypes something, and checks that the message names it and that every earlier
result is byte-identical afterwards (or rebuilt, where the fault is a lost result).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = [pytest.mark.workflow, pytest.mark.slow]

BASE = {"layers": [0, 1], "generation": {"num_frames": 6}, "capture": {"token_profiles": "none"}}
EXTRACT = "results/extract/demo/drift/seed0"


def snapshot(workflow) -> dict[str, str]:
    """sha256 of every result file (logs and benchmarks aside)."""
    root = workflow.path("results")
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.parts[len(root.parts)] not in ("logs", "benchmarks")
    }


def flip(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    for i in range(8):
        data[at + i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """One finished run, copied for each test (mtimes and Snakemake's records included)."""
    from conftest import Workflow

    workflow = Workflow(tmp_path_factory.mktemp("template"))
    workflow.write_config(BASE)
    workflow.run()
    return workflow.directory


@pytest.fixture
def done(template, tmp_path):
    from conftest import Workflow

    shutil.copytree(template, tmp_path / "run", symlinks=True)
    return Workflow(tmp_path / "run")


@pytest.mark.parametrize("damage", ["flip", "delete", "truncate", "stray"])
def test_a_damaged_extraction_stops_the_run_and_is_rebuilt(done, damage):
    before = snapshot(done)
    target = done.path(f"{EXTRACT}/layers1/layer1.parquet")
    if damage == "flip":
        flip(target)
    elif damage == "delete":
        target.unlink()
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:-100])
    else:
        done.path(f"{EXTRACT}/layers1/extra.parquet").write_bytes(b"x")
    dry = done.run("--dry-run", check=False)
    assert dry.returncode != 0 and "layers1" in dry.stderr and "Traceback" not in dry.stderr
    result = done.run(check=False)
    assert result.returncode != 0
    assert "damaged results" in result.stderr and "layers1" in result.stderr and "Traceback" not in result.stderr
    # Nothing downstream was replaced; the damaged folder is kept aside for a look.
    after = {k: v for k, v in snapshot(done).items() if "layers1" not in k}
    assert after == {k: v for k, v in before.items() if "layers1" not in k}
    assert done.path(f"{EXTRACT}/layers1.damaged").is_dir()
    # The next run rebuilds exactly that job, and the same values come back.
    jobs = done.planned_jobs()
    assert jobs["extract_attention"] == 1 and "encode_prompt" not in jobs
    done.run()
    rebuilt = snapshot(done)
    for name in ("layers1/layer1.parquet", "layers0/layer0.parquet"):
        key = f"extract/demo/drift/seed0/{name}"
        assert rebuilt[key] == before[key] or name.startswith("layers1")


def test_a_damaged_table_fails_its_reader_and_earlier_figures_are_restored(done):
    table = done.path("results/tables/checkpoints/demo/head_diagnostics.parquet")
    before = snapshot(done)
    flip(table, at=200)
    result = done.run(check=False)
    assert result.returncode != 0
    assert "head_diagnostics.parquet" in result.stderr and "moved aside" in result.stderr
    # The failed figure jobs gave back their earlier figures (update outputs).
    after = snapshot(done)
    for name in ("figures/demo/head_classes.svg", "figures/demo/entropy_overview.png"):
        assert after[name] == before[name], name
    done.run()  # rebuilds the moved-aside table, then what reads it
    assert done.path("results/tables/checkpoints/demo/head_diagnostics.parquet.damaged").is_file()
    assert done.planned_jobs() == {}


@pytest.mark.parametrize(
    "override, message",
    [
        (["device=cuda"], "config key device: 'cuda' was asked for, but no CUDA device is visible"),
        (["generation={num_frames: 6, latent_height: 100000}"], "an extraction job needs about"),
        ([f"prompts={{{'p' * 250}: a ball}}"], "is longer than 64 characters"),
        (["checkpoints={demo: {weights: notes.pt, model: demo}}"], "notes.pt is not a torch .pt file"),
        (["generation={num_frames: 6, cache_policy: sink, local_attn_frames: 3}"], "local_attn_frames: a window of 3"),
    ],
)
def test_configs_that_cannot_run_are_refused_before_any_job(done, override, message):
    if shutil.which("nvidia-smi") and "cuda" in override[0]:
        pytest.skip("a GPU is visible")
    done.path("notes.pt").write_text("my notes\n")
    before = snapshot(done)
    result = done.run("--config", *override, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and message in output and "Traceback" not in output
    assert snapshot(done) == before


def test_integer_names_in_the_config_file_are_refused(done):
    before = snapshot(done)
    done.path("config.yaml").write_text("prompts:\n  1: a ball moving in a circle\nlayers: [0, 1]\n")
    result = done.run(check=False)
    assert result.returncode != 0 and "config key prompts: the name 1 is a int; names must be strings" in result.stderr
    assert "Traceback" not in result.stderr and snapshot(done) == before


def test_parsing_the_workflow_imports_no_torch(workflow):
    """`snakemake -n` with a torch that refuses to be imported still plans the study."""
    blocker = workflow.path("blocker/torch")
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('torch was imported while parsing')\n")
    workflow.write_config(BASE)
    # The blocker first, then whatever PYTHONPATH names the package under test.
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(blocker.parent), os.environ.get("PYTHONPATH")]))
    )
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workflow.directory),
        "--cores",
        "1",
        "--resources",
        "gpu=1",
        "-n",
    ]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=workflow.directory)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "extract_attention" in result.stdout
