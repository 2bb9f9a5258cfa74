"""Config coercion, defaults and validation; bad configs fail before any job runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from sinkscope.errors import ConfigError
from sinkscope.io import atomic_path
from sinkscope.naming import parse_head_label
from sinkscope.pipeline.config import apply_overrides, load_config, normalize_config, parse_config_overrides
from sinkscope.pipeline.configschema import coerce
from sinkscope.pipeline.machinecheck import check_machine
from sinkscope.pipeline.study import Study
from sinkscope.schema import load_schema


def test_defaults_fill_the_demo_study():
    config = normalize_config({})
    assert config["checkpoints"] == {
        "demo": {
            "model": "demo",
            "format": "self_forcing",
            "weights": "sinkscope:demo_trained.pt",
            "base": None,
            "seed": 0,
            "ema": True,
            "allow_pickle": False,
            "dtype": "auto",
            "train_step": None,
            "lora": None,
        }
    }
    assert config["layers"] == [0, 1, 2, 3, 4, 5]
    assert config["generation"]["num_frames"] == 21
    assert config["generation"]["denoising_steps"] == [1000, 750, 500, 250]
    assert config["figures"] == {
        "heads": ["L1H1", "L5H10"],
        "step": "last",
        "metric": "logit_mean",
        "video_frames": False,
        "frame_base": 0,
        "highlight_layers": None,
        "kinds": "all",
        "variant_kinds": ["figure4", "first_middle_last", "sink_score_overview", "head_classes", "cache_timeline"],
        "dpi": 200,
    }
    assert config["layers_per_job"] == "auto" and config["capture"]["token_profiles"] == "last_block"
    assert config["results"] == "results" and config["replace_results"] is False


def test_strings_from_the_command_line_are_coerced():
    # What `snakemake --config 'layers=[0,1,2]' 'generation={num_frames: 9, ...}'` delivers.
    config = normalize_config(
        {
            "layers": ["0", "1", "2"],
            "seeds": "3",
            "layers_per_job": "2",
            "generation": {
                "num_frames": "9",
                "independent_first_frame": "false",
                "timestep_shift": "5.0",
                "latent_height": "null",
            },
            "figures": {"step": "2", "video_frames": "true"},
        }
    )
    assert config["layers"] == [0, 1, 2]
    assert config["seeds"] == [3]
    assert config["layers_per_job"] == 2
    assert config["generation"]["num_frames"] == 9
    assert config["generation"]["independent_first_frame"] is False
    assert config["generation"]["timestep_shift"] == 5.0
    assert config["generation"]["latent_height"] is None
    assert config["figures"]["step"] == 2 and config["figures"]["video_frames"] is True
    assert normalize_config({"figures": {"step": "cache"}})["figures"]["step"] == "cache"


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"seeds": ["abc"]}, "config key seeds[0]: 'abc' is not an integer"),
        ({"layers": ["0", "x1"]}, "config key layers[1]: 'x1' is not an integer"),
        ({"layers": [9]}, "config key layers: [9] do not exist in checkpoint 'demo' (model has layers 0..5)"),
        ({"bogus": 1}, "unknown config key 'bogus'"),
        ({"generation": {"num_frame": 9}}, "unknown config key 'num_frame' in generation"),
        (
            {"generation": {"num_frames": 20}},
            "config key generation.num_frames: 20 must be a multiple of frames_per_block = 3",
        ),
        ({"generation": {"num_frames": 21, "independent_first_frame": True}}, "num_frames - 1 = 20 must be a multiple"),
        (
            {"generation": {"local_attn_frames": 4, "sink_frames": 2}},
            "a window of 4 frames cannot hold sink_frames = 2 plus a block of 3",
        ),
        ({"generation": {"sink_frames": 2}}, "config key generation.sink_frames: 2 needs a window"),
        (
            {"generation": {"cache_policy": "window", "budget_frames": 4}},
            "generation.budget_frames: 4 has no meaning for cache_policy 'window'",
        ),
        (
            {"generation": {"cache_policy": "participative_compression", "budget_frames": 12}},
            "generation.budget_frames: 12 is below sink_frames + recent_frames = 14",
        ),
        (
            {"generation": {"cache_policy": "participative_compression", "recent_frames": 2}},
            "recent_frames: 2 must hold the current block",
        ),
        (
            {"variants": {"ds": {"cache_policy": "sink", "local_attn_frames": 5}}},
            "config key variants.ds.local_attn_frames: a window of 5",
        ),
        (
            {"generation": {"num_frames": 65537}},
            "config key generation.num_frames: 65537 is greater than the maximum of 65536",
        ),
        ({"prompts": {1: "x"}}, "config key prompts: the name 1 is a int; names must be strings"),
        ({"prompts": {"p" * 250: "x"}}, "is longer than 64 characters"),
        ({"figures": {"heads": ["L1H13"]}}, "figures.heads: 'L1H13' does not exist in checkpoint 'demo'"),
        (
            {"figures": {"heads": ["layer1"]}},
            "config key figures.heads[0]: 'layer1' is not a head like 'L1H1': heads are 1-based",
        ),
        ({"figures": {"metric": "softmax"}}, "config key figures.metric: 'softmax' is not one of"),
        ({"figures": {"step": 7}}, "config key figures.step: 7 is past the last denoising step 3"),
        ({"figures": {"step": "first"}}, "config key figures.step: 'first' is not 'last' or 'cache' or an integer"),
        ({"device": "tpu"}, "config key device: 'tpu' does not match"),
        ({"prompts": {"bad/id": "x"}}, "name 'bad/id' is not allowed"),
        (
            {"checkpoints": {"real": {"weights": "missing.pt"}}},
            "config key checkpoints.real: weights 'missing.pt' do not exist",
        ),
        (
            {"checkpoints": {"real": {"format": "self_forcing"}}},
            "config key checkpoints.real: format 'self_forcing' needs 'weights'",
        ),
        ({"checkpoints": {"d": {"model": "gigantic", "format": "demo"}}}, "unknown model config 'gigantic'"),
        (
            {"legacy_caches": {"old": {"path": "nope.pt"}}},
            "config key legacy_caches.old.path: file 'nope.pt' does not exist",
        ),
    ],
)
def test_bad_configs_name_the_key_and_value(raw, message, tmp_path):
    with pytest.raises(ConfigError) as error:
        normalize_config(raw, base_dir=tmp_path)
    assert message in str(error.value)


def test_several_problems_are_reported_together():
    with pytest.raises(ConfigError) as error:
        normalize_config({"seeds": ["abc"], "layers": ["q"]})
    assert "seeds[0]" in str(error.value) and "layers[0]" in str(error.value)


def test_head_labels_are_one_based():
    assert parse_head_label("L1H1") == (0, 0)
    assert parse_head_label("L5H10") == (4, 9)
    with pytest.raises(ConfigError, match=r"heads are 1-based \(L1H1 = layer 0"):
        parse_head_label("L0H1")


def test_coerce_leaves_valid_values_and_wraps_scalars():
    schema = load_schema()
    assert coerce({"seeds": 4}, schema)["seeds"] == [4]
    assert coerce({"prompts": {"a": "123"}}, schema)["prompts"]["a"] == "123"  # strings stay strings


def test_atomic_path_keeps_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "table.parquet"
    target.write_text("old result")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half a new res")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old result"
    assert [p.name for p in tmp_path.iterdir()] == ["table.parquet"]


@pytest.mark.workflow
@pytest.mark.parametrize(
    "override, message",
    [
        (["seeds=[abc]"], "config key seeds[0]: 'abc' is not an integer"),
        (["layers=[0,9]"], "config key layers: [9] do not exist"),
        (["generation={num_frames: 10}"], "generation.num_frames: 10"),
        (["unknown_key=3"], "unknown config key 'unknown_key'"),
        (["checkpoints={real: {weights: gone.safetensors}}"], "weights 'gone.safetensors' do not exist"),
    ],
)
def test_snakemake_rejects_bad_config_before_any_job(workflow, override, message):
    """A bad --config is refused with the key and value named, no traceback, results untouched."""
    workflow.write_config({"layers": [0], "generation": {"num_frames": 6}})
    earlier = workflow.path("results/tables/frame_attention.parquet")
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"an earlier result")
    result = workflow.run("--config", *override, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert message in output
    assert "Traceback" not in output
    assert earlier.read_bytes() == b"an earlier result"
    assert not workflow.path("results/logs").exists()


def test_latent_grid_must_fit_the_patch_size():
    with pytest.raises(ConfigError, match="generation.latent_height/latent_width: latent grid 7x12"):
        normalize_config({"generation": {"latent_height": 7}})


def test_atomic_outputs_get_the_usual_file_mode(tmp_path):
    import os
    import stat

    with atomic_path(tmp_path / "figure.svg") as tmp:
        tmp.write_text("<svg/>")
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE((tmp_path / "figure.svg").stat().st_mode) == 0o666 & ~mask


@pytest.mark.workflow
def test_names_with_regex_characters_are_matched_literally(workflow):
    workflow.write_config(
        {
            "prompts": {"eagle+sky": "an eagle", "eagle.v2": "an eagle again"},
            "layers": [0],
            "checkpoints": {"demo+1": {"model": "demo", "format": "demo"}},
            "generation": {"num_frames": 3},
        }
    )
    jobs = workflow.planned_jobs()
    assert jobs["extract_attention"] == 2 and jobs["encode_prompt"] == 2


def test_a_text_file_named_pt_is_refused_at_config_time(tmp_path):
    (tmp_path / "model.pt").write_text("not weights\n")
    with pytest.raises(
        ConfigError, match=r"checkpoints.real: .*model.pt is not a torch .pt file \(it starts with 'not "
    ):
        normalize_config({"checkpoints": {"real": {"weights": "model.pt", "model": "demo"}}}, base_dir=tmp_path)


def test_equivalent_configs_give_equal_params():
    def params(raw):
        config = normalize_config(raw)
        study = Study(config)
        return study.extract_params(next(iter(study.runs)), "0")

    assert params({"generation": {"timestep_shift": 5}}) == params({"generation": {"timestep_shift": "5.0"}})
    assert params({"generation": {"num_frames": 24, "local_attn_frames": 9}}) == params(
        {"generation": {"num_frames": 24, "cache_policy": "window", "local_attn_frames": 9}}
    )
    assert params({"generation": {"num_frames": 30, "cache_policy": "deep_sink"}}) == params(
        {"generation": {"num_frames": 30, "cache_policy": "deep_sink", "local_attn_frames": 21, "sink_frames": 10}}
    )
    trained = {"model": "demo", "format": "self_forcing", "weights": "sinkscope:demo_trained.pt"}
    assert params({"checkpoints": {"demo": trained}}) == params(
        {"checkpoints": {"demo": {**trained, "format": "auto", "train_step": 1436}}}
    )  # train_step orders a figure only; 'auto' is the format it detects
    assert params({}) != params({"generation": {"timestep_shift": 3}})


def test_machine_checks_refuse_a_missing_gpu_and_an_oversized_job(monkeypatch):
    config = normalize_config({"device": "cuda"})
    monkeypatch.setattr("sinkscope.pipeline.resources.cuda_device_count", lambda: 0)
    with pytest.raises(ConfigError, match="config key device: 'cuda' was asked for, but no CUDA device is visible"):
        check_machine(config, Study(config).checkpoints)
    big = normalize_config({"generation": {"latent_height": 100000}})
    with pytest.raises(ConfigError, match=r"checkpoint 'demo': an extraction job needs about \d+\.\d GiB .*KV cache"):
        check_machine(big, Study(big).checkpoints)
    # A cluster run checks only an explicit limit; the device is the compute nodes'.
    assert check_machine(config, Study(config).checkpoints, local=False) == "cuda"
    limited = normalize_config({"max_job_memory_gib": 0.001})
    with pytest.raises(ConfigError, match="more than max_job_memory_gib = 0.001"):
        check_machine(limited, Study(limited).checkpoints, local=False)


def test_dotted_overrides_set_one_nested_key(tmp_path):
    (tmp_path / "config.yaml").write_text("generation:\n  num_frames: 24\n")
    config = load_config(
        tmp_path / "config.yaml", {"generation.local_attn_frames": 9, "generation.cache_policy": "window"}
    )
    assert config["generation"]["num_frames"] == 24 and config["generation"]["local_attn_frames"] == 9


def test_overrides_are_read_as_snakemake_config_reads_them():
    from snakemake.cli import parse_config

    pairs = [
        "layers=[0,1]",
        "seeds=",
        "compile=True",
        "timestep_shift=1e308",
        "name=null",
        "dpi=7",
        "generation={num_frames: 9, denoising_steps: [1000, 500]}",
        "prompts=[unclosed",
        "figures={heads: [L1H1]}",
        "generation={procedure: rolling_forcing}",
    ]
    assert parse_config_overrides(pairs) == parse_config(pairs)
    for refused in (["generation.num_frames=9"], ["x=1"], ["1a=2"]):
        with pytest.raises(ValueError):
            parse_config(refused)
        with pytest.raises(ConfigError):
            parse_config_overrides(refused)


def test_a_nested_override_merges_into_its_section():
    raw = {"generation": {"num_frames": 21, "cache_policy": "sink"}, "layers": [0, 1]}
    merged = apply_overrides(raw, parse_config_overrides(["generation={num_frames: 9}", "layers=[4]"]))
    assert merged == {"generation": {"num_frames": "9", "cache_policy": "sink"}, "layers": ["4"]}


def test_layer_groups_follow_the_config_order():
    config = normalize_config({"layers": [0, 4], "layers_per_job": 4})
    assert Study(config).layer_groups == [[0, 4]]
    config = normalize_config({"layers": [5, 0, 4, 1], "layers_per_job": 2})
    assert Study(config).layer_groups == [[5, 0], [4, 1]]
    auto = normalize_config({"layers": [0, 1, 2]})
    assert Study(auto, device="cuda").layer_groups == [[0, 1, 2]]
    assert Study(auto, device="cpu").layer_groups == [[0], [1], [2]]


def test_generation_options_built_directly_default_as_the_schema_does():
    import dataclasses

    from sinkscope.options import GenerationOptions, option_owners
    from sinkscope.schema import schema_defaults

    fields = {field.name: field.default for field in dataclasses.fields(GenerationOptions)}
    # A key one policy or procedure declares defaults where its OptionSpec says.
    fields.update({key: option.default for key, (_, _, option) in option_owners().items()})
    for key, default in schema_defaults("generation").items():
        if default is not None:  # null: the policy's default, resolved by from_config
            expected = tuple(default) if isinstance(default, list) else default
            assert fields[key] == expected, key


def test_figures_that_compare_are_planned_only_with_two_of_what_they_compare():
    """policy_comparison compares variants, attention_across_checkpoints checkpoints: one
    of them makes a duplicate of figure4 or a single column of dots, so neither is planned;
    sink_mass_over_time and sink_collapse draw one variant as well and stay."""
    from sinkscope.figures.registry import CHECKPOINT_FIGURES, FIGURES, STUDY_FIGURES

    def planned(raw) -> set[str]:
        return {
            Path(p).stem
            for p in Study(normalize_config(raw)).figure_targets()
            if Path(p).stem in (*CHECKPOINT_FIGURES, *STUDY_FIGURES)
        }

    assert FIGURES["policy_comparison"].compares == "variants"
    assert FIGURES["attention_across_checkpoints"].compares == "checkpoints"
    assert planned({}) == {"sink_mass_over_time", "sink_collapse"}
    one = {"variants": {"window": {"cache_policy": "window", "local_attn_frames": 6}}}  # replaces the default
    assert planned(one) == {"sink_mass_over_time", "sink_collapse"}
    two_variants = {"variants": {**one["variants"], "global": {"cache_policy": "global"}}}
    assert planned(two_variants) == {"sink_mass_over_time", "sink_collapse", "policy_comparison"}
    two = {
        "checkpoints": {
            "demo": {"model": "demo", "format": "demo"},
            "other": {"model": "demo", "format": "demo", "seed": 1},
        }
    }
    study = Study(normalize_config(two))
    assert {Path(p).stem for p in study.figure_targets()} >= {"attention_across_checkpoints", "sink_mass_over_time"}
    assert "policy_comparison" not in {Path(p).stem for p in study.figure_targets()}
    # What the summary page shows is only what is planned, and the rule reads it.
    shown = Study(normalize_config({})).summary_figures()
    assert shown["demo"]["sink_mass_over_time"] == "results/figures/demo/sink_mass_over_time.svg"
    assert set(Study(normalize_config({})).summary_figure_paths()) <= set(Study(normalize_config({})).figure_targets())


def test_figures_that_show_head_classes_read_head_diagnostics():
    study = Study(normalize_config({"layers": [0, 4]}))
    assert "results/tables/checkpoints/demo/head_diagnostics.parquet" in study.figure_inputs("figure4", "demo")
    inputs = study.layer_figure_inputs("per_head_grid", "demo", 4)
    assert inputs[-1] == "results/tables/checkpoints/demo/head_diagnostics.parquet"
    assert inputs[:-1] == study.source_inputs("demo", 4)
    assert study.layer_figure_inputs("heads_heatmap", "demo", 4) == inputs  # its rows are titled with the classes
    options = study.figure_options("summary")
    assert options["checkpoints"]["demo"]["weights"] == "sinkscope:demo_trained.pt"
    assert options["diagnostics"]["sink_ratio"] == 5.0 and "figure4" in options["figures"]["demo"]


def test_capture_compile_is_auto_by_default_and_takes_booleans():
    assert normalize_config({})["capture"]["compile"] == "auto"
    assert normalize_config({"capture": {"compile": "true"}})["capture"]["compile"] is True
    assert normalize_config({"capture": {"compile": "off"}})["capture"]["compile"] is False
    with pytest.raises(ConfigError, match="capture.compile"):
        normalize_config({"capture": {"compile": "sometimes"}})


def test_the_workflow_validates_against_the_packages_schema():
    """One schema file: the package's (rules/common.smk validates with it); the top-level
    schemas/config.schema.yaml, where the Snakemake layout puts it, is a link to it."""
    from sinkscope.schema import SCHEMA_PATH

    root = Path(__file__).resolve().parent.parent
    link = root / "schemas" / "config.schema.yaml"
    assert link.is_symlink() and link.resolve() == SCHEMA_PATH.resolve()
    assert "schema=str(SCHEMA_PATH)" in (root / "rules" / "common.smk").read_text()


def test_capture_attention_is_exact_by_default_and_reaches_the_jobs():
    assert normalize_config({})["capture"]["attention"] == "exact"
    with pytest.raises(ConfigError, match="capture.attention"):
        normalize_config({"capture": {"attention": "fast"}})
    with pytest.raises(ConfigError, match="capture.attention: 'fused' is a Triton kernel's"):
        normalize_config({"capture": {"attention": "fused", "backend": "torch"}})
    # The route changes the captured layers' outputs (slightly), so it is a job parameter.
    study = Study(normalize_config({"capture": {"attention": "fused"}}))
    assert study.extract_params(next(iter(study.runs)), "0")["capture"]["attention"] == "fused"


def test_capture_kernels_are_fast_by_default_and_reach_the_jobs():
    assert normalize_config({})["capture"]["kernels"] == "fast"
    with pytest.raises(ConfigError, match="capture.kernels"):
        normalize_config({"capture": {"kernels": "exact"}})
    # The kernels round the video differently, so they are a job parameter.
    study = Study(normalize_config({"capture": {"kernels": "reference"}}))
    assert study.extract_params(next(iter(study.runs)), "0")["capture"]["kernels"] == "reference"


def test_compile_auto_means_cuda_a_long_rollout_and_blocks_without_the_fused_norms():
    import torch

    from sinkscope.pipeline.extract import COMPILE_AUTO_MIN_FRAMES, compile_wanted

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert compile_wanted("auto", cuda, COMPILE_AUTO_MIN_FRAMES)
    assert not compile_wanted("auto", cuda, 21)
    # With the fused norm kernels eager is as fast as compiled: nothing to repay the compile.
    assert not compile_wanted("auto", cuda, 480, fused_norms=True)
    assert compile_wanted(True, cuda, 21, fused_norms=True)
    assert not compile_wanted("auto", cpu, 480) and not compile_wanted(True, cpu, 480)
    assert compile_wanted(True, cuda, 21) and not compile_wanted(False, cuda, 480)
