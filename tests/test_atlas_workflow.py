"""Sweeps through the real Snakemake DAG on the demo: a small sweep over heads, a layer and a
frame, with the pruning curve, gives the atlas tables (checked against the runs' own
latents), the head orders and the atlas figures; written out by hand, the same study has
nothing to do; a job of several runs killed half-way keeps the runs it finished for the
next run. Kept small (one seed, one captured layer, six frames): the CI's time is shared."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import SNAKEFILE, Workflow

from sinkscope.naming import head_label
from sinkscope.pipeline.latents import read_latents
from sinkscope.tables import ALL_PROMPTS, read_table

pytestmark = pytest.mark.workflow

STUDY = {
    "checkpoints": {"demo": {"model": "demo", "format": "self_forcing", "weights": "sinkscope:demo_trained.pt"}},
    "prompts": {"drift": "a ball drifting left to right"},
    "seeds": [0],
    "layers": [0],
    "device": "cpu",
    "generation": {"num_frames": 6, "frames_per_block": 3, "denoising_steps": [1000, 500]},
    "figures": {"kinds": ["head_atlas", "frame_atlas", "pruning_curve"], "heads": ["L1H1"]},
}
SWEEPS = {
    "heads": {
        "interventions": [{"edit": "mask_keys", "heads": "each", "key_frames": "sink"}],
        "over": ["L1H1", "L1H2"],
    },
    "layer": {"interventions": [{"edit": "mask_keys", "heads": "each:layer", "key_frames": "sink"}], "over": "L1"},
    "frame": {"interventions": [{"edit": "mask_keys", "heads": "all", "key_frames": "each"}], "over": [1]},
    "prune": {
        "interventions": [{"edit": "mask_keys", "heads": "each", "key_frames": "cached"}],
        "over": "atlas:heads",
        "k": [1, 2],
    },
}


def by_hand() -> dict[str, dict]:
    """SWEEPS written out as variants, in spellings of their own."""
    variants = {
        f"heads/{label}": {"interventions": [{"edit": "mask_keys", "heads": [label], "key_frames": "sink"}]}
        for label in ("L1H1", "L1H2")
    }
    variants["layer/L1"] = {"interventions": [{"edit": "mask_keys", "heads": "L1", "key_frames": "sink"}]}
    variants["frame/f1"] = {"interventions": [{"edit": "mask_keys", "heads": "all", "key_frames": 1}]}
    for order in ("drift", "random", "frame0_mass"):
        heads = f"atlas:heads:{order}:1"
        variants[f"prune/{order}_k1"] = {
            "interventions": [{"edit": "mask_keys", "heads": heads, "key_frames": "cached"}]
        }
    variants["prune/all_k2"] = {
        "interventions": [{"edit": "mask_keys", "heads": ["L1H2", "L1H1"], "key_frames": "cached"}]
    }
    return variants


def test_a_sweep_gives_its_atlases_and_the_same_runs_written_by_hand_rerun_nothing(workflow: Workflow):
    workflow.write_config({**copy.deepcopy(STUDY), "sweeps": SWEEPS})
    planned = workflow.planned_jobs()
    # The five atlas runs that wait for nothing in one job, the three pruning runs of k = 1 in
    # another, after the head orders; the untouched run a job of its own.
    assert planned["extract_runs_1"] == 1 and planned["extract_runs_2"] == 1 and planned["extract_attention"] == 1
    assert planned["atlas_head_orders"] == 1 and planned["atlas_tables"] == 1
    workflow.run()
    results = workflow.path("results")
    orders = json.loads((results / "atlas/demo/heads/head_orders.json").read_text())["orders"]
    atlas = read_table(results / "tables/head_atlas.parquet")
    averaged = atlas[atlas["prompt_id"] == ALL_PROMPTS]
    assert sorted(averaged["variant"]) == ["heads/L1H1", "heads/L1H2", "layer/L1"]
    classes = json.loads((results / "interventions/demo/head_classes.json").read_text())["classes"]
    for row in averaged[averaged["head"] >= 0].itertuples(index=False):
        assert row.head_class == classes[head_label(row.layer, row.head)]  # the untouched run's class
    # Each drift against the runs' own latents: the last block's frames 3-5.
    default = read_latents(results / "extract/demo/drift/seed0/layers0")
    for row in averaged.itertuples(index=False):
        moved = read_latents(results / f"extract/demo@{row.variant}/drift/seed0/layers0")
        distance = [np.linalg.norm(moved[:, f] - default[:, f]) / np.linalg.norm(default[:, f]) for f in range(3, 6)]
        assert row.drift_last_block == pytest.approx(np.mean(distance), rel=1e-6)
    heads = averaged[averaged["head"] >= 0].sort_values(["drift_last_block", "layer", "head"])
    assert orders["drift"] == [head_label(int(a), int(b)) for a, b in zip(heads["layer"], heads["head"])]
    curve = read_table(results / "tables/pruning_curve.parquet")
    assert sorted(curve.loc[curve["prompt_id"] == ALL_PROMPTS, "variant"]) == sorted(
        f"prune/{item}" for item in ("drift_k1", "random_k1", "frame0_mass_k1", "all_k2")
    )
    frames = read_table(results / "tables/frame_atlas.parquet")
    assert list(frames.loc[frames["prompt_id"] == ALL_PROMPTS, "key_frame"]) == [1]
    for kind in ("head_atlas", "frame_atlas", "pruning_curve"):
        assert (results / f"figures/demo/{kind}.png").stat().st_size > 0
    assert not (results / "tables/checkpoints/demo@heads").exists()  # atlas runs get no tables of their own
    # The same runs written by hand: the same jobs, params and files, nothing to do.
    workflow.write_config({**copy.deepcopy(STUDY), "variants": by_hand()})
    assert workflow.planned_jobs() == {}


def _job_processes(script: str) -> list[int]:
    """The process ids of Snakemake jobs running ``script`` (their command line names it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if script in command and "snakemake" not in command.split(" ", 1)[0]:
                found.append(int(entry.name))
    return found


def test_a_job_killed_half_way_keeps_its_finished_runs_for_the_next_run(tmp_path):
    """A real extraction job of three runs is killed once its first run waits in staging:
    Snakemake fails the job (and deletes its outputs); the next run's job takes the first
    run from staging, made once, and makes the other two."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    config = {
        **copy.deepcopy(STUDY),
        # Runs long enough on the CPU (a second or so each) to stop the job between two.
        "layers": [0, 1, 2, 3, 4, 5],
        "layers_per_job": 6,
        "generation": {"num_frames": 21, "frames_per_block": 3, "denoising_steps": [1000, 750, 500, 250]},
        "figures": {"kinds": ["head_atlas"], "heads": ["L1H1"]},
        "sweeps": {"heads": {**SWEEPS["heads"], "over": ["L1H1", "L1H2", "L1H3"]}},
    }
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    log = workdir / "first.log"
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(SNAKEFILE), "--directory", str(workdir)]
    command += ["--cores", "1", "--resources", "gpu=1"]
    staged = workdir / "results/.staging/extract/demo@heads/L1H1/drift/seed0/layers0/manifest.json"
    with open(log, "w") as handle:
        process = subprocess.Popen(
            command, cwd=workdir, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 600
    while not staged.exists():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    latents_inode = (staged.parent / "latents.safetensors").stat().st_ino
    jobs = _job_processes("extract_runs")
    assert jobs, "the job's process"
    for pid in jobs:
        os.kill(pid, signal.SIGKILL)
    process.wait(timeout=600)
    assert process.returncode != 0 and "extract_runs_1" in log.read_text()
    assert staged.exists() and not (workdir / "results/extract/demo@heads/L1H1/drift/seed0/layers0").exists()
    second = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    job_log = (workdir / "results/logs/extract_runs/demo/job1/drift/seed0.log").read_text()
    assert "taken from results/.staging/extract/demo@heads/L1H1/drift/seed0/layers0" in job_log
    assert "3 runs: 2 made, 1 kept or taken from staging" in job_log
    final = workdir / "results/extract/demo@heads/L1H1/drift/seed0/layers0/latents.safetensors"
    assert final.stat().st_ino == latents_inode  # the first run's file, moved into place
    assert not (workdir / "results/.staging").exists()


def test_two_gpus_run_two_jobs_of_several_runs_at_once(tmp_path):
    """--resources gpu=2: each extraction job asks for one GPU, so the jobs of two seeds run
    side by side (here on the CPU; on a machine of two GPUs each job takes a free one)."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    config = {**copy.deepcopy(STUDY), "seeds": [0, 1], "sweeps": {"heads": SWEEPS["heads"]}}
    config["figures"] = {"kinds": ["head_atlas"], "heads": ["L1H1"]}
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(SNAKEFILE), "--directory", str(workdir)]
    result = subprocess.run(
        [*command, "--cores", "2", "--resources", "gpu=2", "--until", "extract_runs_1"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    started = r"(?:local)?rule extract_runs_1:"
    events = re.findall(rf"^({started}|Finished jobid: \d+ \(Rule: extract_runs_1\))", result.stderr, re.M)
    assert len(events) == 4 and all(e.endswith("extract_runs_1:") for e in events[:2]), events  # both ran at once


def test_a_profiles_extract_attention_resources_reach_the_jobs_of_several_runs(workflow: Workflow):
    """A cluster profile names extract_attention in set-resources (its partition, memory,
    runtime); the jobs of several runs, one rule each, take the same."""
    workflow.write_config({**copy.deepcopy(STUDY), "sweeps": {"heads": SWEEPS["heads"]}})
    result = workflow.run(
        "--dry-run",
        "--set-resources",
        "extract_attention:mem_mb=1234",
        "extract_attention:slurm_partition=gpu",
    )
    job = result.stdout.split("rule extract_runs_1:", 1)[1].split("\n\n", 1)[0]
    resources = next(line for line in job.splitlines() if line.strip().startswith("resources:"))
    assert "gpu=1" in resources and "slurm_partition=gpu" in resources and "mem_mb=1234" in resources
