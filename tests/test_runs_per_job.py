"""runs_per_job: several runs of one checkpoint, prompt and seed in one extraction job, the
model loaded once. The plan puts runs in jobs by their names alone (equal jobs and params
for a sweep and its variants written by hand); each run's params are what it gets alone;
a job's runs equal the same runs one a job (latents and rows, on the CPU); a job keeps the
runs it made for the same inputs and, interrupted, takes its finished runs from the staging
folder on its next attempt, through Snakemake too (a real job killed half-way)."""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest

from sinkscope.errors import ConfigError
from sinkscope.naming import decode_layers, encode_layers
from sinkscope.pipeline.extractplan import chunks, run_params
from sinkscope.pipeline.study import load_study
from sinkscope.tables import read_table

MASK_SINK = {"edit": "mask_keys", "heads": "each", "key_frames": "sink"}
FRAMES = {"edit": "mask_keys", "heads": "all", "key_frames": "each"}
BASE = {
    "checkpoints": {"demo": {"model": "demo", "format": "self_forcing", "weights": "sinkscope:demo_trained.pt"}},
    "prompts": {"drift": "a ball drifting left to right"},
    "seeds": [0],
    "device": "cpu",
    "layers": [0, 1],
    "layers_per_job": 2,
    "generation": {"num_frames": 6, "frames_per_block": 3, "denoising_steps": [1000, 500]},
}


def study_of(**extra):
    return load_study({**copy.deepcopy(BASE), **copy.deepcopy(extra)}, check_this_machine=False)


# -- the plan ----------------------------------------------------------------------------------------


def test_chunks_are_as_few_as_fit_and_equal_within_one():
    assert chunks(0, 4) == [] and chunks(3, 1) == [1, 1, 1] and chunks(5, 64) == [5]
    assert chunks(130, 64) == [44, 43, 43] and chunks(128, 64) == [64, 64]
    for count in range(1, 80):
        for size in (1, 2, 7, 64):
            parts = chunks(count, size)
            assert sum(parts) == count and max(parts) <= size and max(parts) - min(parts) <= 1
            assert len(parts) == -(-count // size)


def test_runs_go_in_jobs_by_name_and_what_they_wait_for():
    study = study_of(
        layers=[0, 1, 2, 3, 4, 5],
        layers_per_job=6,
        runs_per_job=8,
        variants={
            "no_sink": {"interventions": [{"edit": "mask_keys", "heads": "class:sink", "key_frames": [0]}]},
            "int8": {"interventions": [{"edit": "quantize_cache", "format": "int8"}]},
        },
        sweeps={
            "heads": {"interventions": [MASK_SINK], "over": ["L1H1", "L1H2", "L1H10", "L2H1", "L6H12"]},
            "prune": {
                "interventions": [{"edit": "mask_keys", "heads": "each", "key_frames": "cached"}],
                "over": "atlas:heads",
                "k": [2, 5],
            },
        },
    )
    jobs = study.extraction_jobs
    # The atlas runs that wait for nothing (5 heads and prune/all_k5) in one job.
    assert [len(job.sources) for job in jobs] == [6, 3]
    first, pruning = jobs
    assert first.inputs == () and first.sources == (
        "demo@heads/L1H1",
        "demo@heads/L1H2",
        "demo@heads/L1H10",  # natural order: 2 before 10
        "demo@heads/L2H1",
        "demo@heads/L6H12",
        "demo@prune/all_k5",
    )
    assert pruning.inputs == ("results/atlas/demo/heads/head_orders.json",)
    assert pruning.sources == ("demo@prune/drift_k2", "demo@prune/frame0_mass_k2", "demo@prune/random_k2")
    # The untouched run and the variants with tables of their own: one run a job
    # (extract_attention), so that editing one reruns its own tables and figures alone.
    assert study.single_runs == ["demo", "demo@no_sink", "demo@int8"]
    assert study.edit_inputs("demo@no_sink") == ["results/interventions/demo/head_classes.json"]
    assert [job.rule for job in jobs] == ["extract_runs_1", "extract_runs_2"]
    assert [job.label for job in jobs] == ["job1", "job2"]
    # Atlas runs capture the layers of the heads they edit; the others every layer.
    assert study.run_groups("demo@heads/L2H1") == [[1]] and study.run_groups("demo@heads/L6H12") == [[5]]
    assert study.run_groups("demo@int8") == study.run_groups("demo@prune/drift_k2") == [[0, 1, 2, 3, 4, 5]]
    assert study.capture_params("demo@heads/L2H1")["token_profiles"] == "none"
    assert study.capture_params("demo@int8")["token_profiles"] == "last_block"
    every = study_of(
        layers=[0, 1, 2], layers_per_job=3, capture={"atlas_runs": "all"}, sweeps={"h": {"interventions": [MASK_SINK]}}
    )
    assert every.run_groups("demo@h/L5H1") == [[0, 1, 2]]
    assert every.capture_params("demo@h/L5H1")["token_profiles"] == "last_block"
    # layers_per_job: auto on the CPU is one layer a job; an atlas run is one generation.
    auto = study_of(layers=[0, 1, 2], layers_per_job="auto", sweeps={"f": {"interventions": [FRAMES]}})
    assert auto.run_groups("demo") == [[0], [1], [2]] and auto.run_groups("demo@f/f0") == [[0, 1, 2]]
    # A head outside the captured layers: the first captured layer, for the rows.
    outside = study_of(layers=[0, 1], sweeps={"h": {"interventions": [MASK_SINK], "over": "L5"}})
    assert outside.run_groups("demo@h/L5H3") == [[0]]


def test_a_run_of_a_job_gets_the_params_it_gets_alone_and_one_a_job_means_no_jobs():
    config = {
        "runs_per_job": 3,
        "variants": {"longer": {"num_frames": 9}, "window": {"cache_policy": "window", "local_attn_frames": 3}},
        "sweeps": {"heads": {"interventions": [MASK_SINK], "over": "L2"}},
    }
    study = study_of(**config)
    assert len(study.extraction_jobs) == 4  # 12 atlas runs in 4 jobs of 3
    assert study.single_runs == ["demo", "demo@longer", "demo@window"]
    for job in study.extraction_jobs:
        params = study.job_params(job)
        folders = study.job_folders(job)
        index = 0
        for number, source in enumerate(job.sources):
            for group in study.run_groups(source):
                assert folders[index] == (source, encode_layers(group))
                alone = study.extract_params(source, encode_layers(group))
                assert run_params(params, number, decode_layers(encode_layers(group))) == alone
                index += 1
        # The untouched generation once; each run only what differs from it: its edits.
        assert all(set(run["generation"]) == {"interventions"} for run in params["runs"])
    alone = study_of(**{**config, "runs_per_job": 1})
    assert alone.extraction_jobs == [] and alone.single_runs == list(alone.runs)


def test_jobs_depend_on_the_set_of_runs_not_on_the_order_written():
    variants = {  # atlas runs written by hand, in two orders
        f"bias/v{i}": {"interventions": [{"edit": "logit_bias", "heads": "all", "key_frames": [0], "bias": -i}]}
        for i in range(1, 6)
    }
    forward = study_of(variants=variants, runs_per_job=2)
    backward = study_of(variants=dict(reversed(list(variants.items()))), runs_per_job=2)
    assert forward.extraction_jobs == backward.extraction_jobs
    assert [forward.job_params(j) for j in forward.extraction_jobs] == [
        backward.job_params(j) for j in backward.extraction_jobs
    ]


def test_a_sweep_over_heads_of_a_class_is_refused_in_one_line():
    with pytest.raises(ConfigError) as error:
        study_of(sweeps={"sinks": {"interventions": [MASK_SINK], "over": "class:sink"}})
    assert error.value.problems == [
        "config key sweeps.sinks.over: 'class:sink' chooses heads by the untouched run's classes, which exist only "
        "after it ran, and the workflow plans every run of a sweep before it starts; write over: all, or list the "
        "heads (its head_classes.csv names each head's class)"
    ]


# -- the job, on the CPU --------------------------------------------------------------------------------


def _embedding(study, folder: Path) -> Path:
    from sinkscope.model.text import encode_prompts, save_embedding

    encoder = study.text_encoder("demo")
    text = study.prompts["drift"]
    path = folder / "drift.safetensors"
    save_embedding(path, encode_prompts(encoder, {"drift": text})["drift"], prompt=text, encoder=encoder)
    return path


def _job_call(study, job, embedding: Path, code: str = "code") -> dict:
    outputs = [
        study.path("extract_dir", source=source, prompt="drift", seed=0, group=group)
        for source, group in study.job_folders(job)
    ]
    return dict(
        job=study.job_params(job),
        prompt_id="drift",
        seed=0,
        outputs=outputs,
        embedding=[embedding],
        weights_sha256=study.weights_sha256("demo"),
        staging=study.staging,
        code=code,
    )


def _rows(folder) -> pd.DataFrame:
    from sinkscope.pipeline.aggregate import extraction_files

    return pd.concat([read_table(path) for path in extraction_files(folder)["frames"]], ignore_index=True)


@pytest.mark.slow
def test_a_jobs_runs_equal_the_same_runs_one_a_job_and_an_interrupted_job_resumes(tmp_path, monkeypatch):
    from sinkscope.pipeline import extract
    from sinkscope.pipeline.latents import read_latents
    from sinkscope.tables import read_metadata

    monkeypatch.chdir(tmp_path)
    study = study_of(results="out", sweeps={"heads": {"interventions": [MASK_SINK], "over": ["L1H1", "L2H5", "L2H7"]}})
    (job,) = study.extraction_jobs
    assert job.sources == ("demo@heads/L1H1", "demo@heads/L2H5", "demo@heads/L2H7")
    embedding = _embedding(study, tmp_path)
    call = _job_call(study, job, embedding)

    # Interrupted at its second run: the first waits in staging, nothing is in place.
    real = extract._generate
    made = []

    def failing(*args, **kwargs):
        if len(made) == 1:
            raise KeyboardInterrupt
        made.append(args[4].variant)
        return real(*args, **kwargs)

    monkeypatch.setattr(extract, "_generate", failing)
    with pytest.raises(KeyboardInterrupt):
        extract.extract_runs_job(**call)
    staged = Path(study.staging) / "extract/demo@heads/L1H1/drift/seed0/layers0"
    assert (staged / "manifest.json").is_file() and not any(Path(p).exists() for p in call["outputs"])
    first_latents = (staged / "latents.safetensors").stat().st_ino

    # The next attempt takes it from staging and makes the other two.
    made.clear()
    monkeypatch.setattr(extract, "_generate", lambda *a, **k: made.append(a[4].variant) or real(*a, **k))
    extract.extract_runs_job(**call)
    assert made == ["heads/L2H5", "heads/L2H7"]
    assert (Path(call["outputs"][0]) / "latents.safetensors").stat().st_ino == first_latents  # moved, not redone
    assert not Path(study.staging).exists()  # emptied and removed

    # Done for the same inputs: kept. Other code, or other head classes or orders: made again.
    made.clear()
    extract.extract_runs_job(**call)
    assert made == []
    extract.extract_runs_job(**{**call, "code": "other code"})
    assert made == ["heads/L1H1", "heads/L2H5", "heads/L2H7"]
    made.clear()
    extract.extract_runs_job(**{**call, "code": "other code", "edit_files": [embedding]})
    assert made == ["heads/L1H1", "heads/L2H5", "heads/L2H7"]

    # Each equals the same run alone (latents and rows).
    for (source, group), output in zip(study.job_folders(job), call["outputs"]):
        alone = tmp_path / "alone" / source / group
        params = study.extract_params(source, group)
        extract.extract_job(
            checkpoint=params["checkpoint"],
            variant=params["variant"],
            prompt_id="drift",
            seed=0,
            layers=params["layers"],
            output=alone,
            embedding=[embedding],
            weights_sha256=call["weights_sha256"],
            generation=params["generation"],
            capture=params["capture"],
            compute=params["compute"],
        )
        first = next(Path(output).glob("layer*.parquet"))
        assert (
            read_metadata(first)["latents_sha256"]
            == read_metadata(next(alone.glob("layer*.parquet")))["latents_sha256"]
        )
        assert (read_latents(output) == read_latents(alone)).all()
        pd.testing.assert_frame_equal(_rows(output), _rows(alone))
