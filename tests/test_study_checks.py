"""One check for everything: ``sinkscope check`` and the Snakefile run ``load_study`` and
refuse the same configs, at config time, each with one line naming the key or file."""

from __future__ import annotations

import math
import re

import pytest
import yaml
from conftest import REPO

from sinkscope.cli import main as cli_main
from sinkscope.errors import ConfigError, SinkscopeError
from sinkscope.pipeline.config import checked_config, generation_options, read_config_file
from sinkscope.pipeline.machinecheck import check_machine, resolve_layers_per_job, study_layers_per_job
from sinkscope.pipeline.study import load_study

# (config file text, what the error must name)
BAD_CONFIG_FILES = {
    "duplicate_prompt": ("prompts:\n  circle: a\n  circle: b\n", "key 'circle' is given twice"),
    "duplicate_section": ("layers: [0]\nlayers: [1]\n", "key 'layers' is given twice"),
    "nan_shift": ("generation:\n  timestep_shift: .nan\n", "generation.timestep_shift: nan is not a finite number"),
    "inf_shift": ("generation:\n  timestep_shift: .inf\n", "generation.timestep_shift: inf is not a finite number"),
    "nan_context_noise": ("generation:\n  context_noise: .nan\n", "generation.context_noise: nan"),
    "nan_memory": ("max_job_memory_gib: .nan\n", "max_job_memory_gib: nan"),
    "context_noise_past_schedule": ("generation:\n  context_noise: 5000\n", "generation.context_noise: 5000"),
    "increasing_steps": (
        "generation:\n  denoising_steps: [250, 1000]\n",
        "generation.denoising_steps: [250, 1000] must decrease",
    ),
    "whitespace_prompt": ("prompts:\n  blank: '   '\n", "prompts.blank: the prompt is empty"),
    "seed_past_int64": ("seeds: [9223372036854775808]\n", "seeds[0]"),
    "highlight_layer_missing": ("figures:\n  highlight_layers: [99]\n", "figures.highlight_layers: [99] do not exist"),
    "first_k_past_video": ("diagnostics:\n  first_k: 1000\n", "diagnostics.first_k: 1000 frames are more"),
    "periodic_prompt_id": (
        "prompts:\n  take_00000000000000000000: a ball\n",
        "config key prompts: name 'take_00000000000000000000' is not allowed: it ends in '0' repeated 20 times",
    ),
    "triton_on_cpu": ("device: cpu\ncapture:\n  backend: triton\n", "capture.backend: 'triton'"),
    "head_zero": ("figures:\n  heads: [L0H1]\n", "'L0H1' is not a head like 'L1H1': heads are 1-based (L1H1 = layer 0"),
    "shift_overflows_schedule": (
        "generation:\n  timestep_shift: 1.0e+308\n",
        "generation.timestep_shift: 1e+308 makes the denoising schedule non-finite",
    ),
    "highlight_layer_not_captured": (
        "layers: [0, 1]\nfigures:\n  highlight_layers: [1, 4]\n",
        "figures.highlight_layers: [4] are not captured (layers: [0, 1])",
    ),
    "misspelled_key": ("generation:\n  num_frame: 9\n", "'num_frame' in generation (did you mean 'num_frames'?)"),
    "bias_overflows": (
        "variants:\n  v:\n    interventions:\n"
        "      - {edit: logit_bias, heads: all, key_frames: [0], bias: 1.0e+300}\n",
        "variants.v.interventions[0].bias: 1e+300 makes the edited scores overflow after the softmax's max shift",
    ),
    "biases_add_up_past_the_limit": (
        "variants:\n  v:\n    interventions:\n"
        "      - {edit: logit_bias, heads: all, key_frames: [0], bias: 6.0e+37}\n"
        "      - {edit: logit_bias, heads: [L1H1], key_frames: [1], bias: -6.0e+37}\n",
        "variants.v.interventions: the logit_bias edits' biases add up to 1.2e+38",
    ),
    "empty_interventions": (
        "variants:\n  v:\n    interventions: []\n",
        "variants.v.interventions: an empty list edits nothing",
    ),
    "edit_given_twice": (
        "variants:\n  v:\n    interventions:\n"
        "      - {edit: mask_keys, heads: [L1H1], key_frames: [0]}\n"
        "      - {edit: mask_keys, heads: [L1H1], key_frames: [0]}\n",
        "variants.v.interventions[1]: the same edit as [0] (give it once)",
    ),
    "compile_on_the_cpu": (
        "device: cpu\ncapture:\n  compile: true\n",
        "capture.compile: true compiles the model's blocks on CUDA only, and the jobs compute on 'cpu'",
    ),
    "flash4_on_the_cpu": (
        "device: cpu\ncapture:\n  attention_kernel: flash4\n",
        "capture.attention_kernel: 'flash4' runs on CUDA only, and the jobs compute on 'cpu'; use auto or cudnn",
    ),
    "figure_head_not_captured": (
        "layers: [0, 1]\nfigures:\n  heads: [L1H1, L3H2]\n",
        "figures.heads: 'L3H2' is in layer 2 (0-based), which the study does not capture (layers: [0, 1])",
    ),
    "memory_past_any_machine": ("max_job_memory_gib: 1.0e+300\n", "max_job_memory_gib: 1e+300 is greater than"),
    "legacy_prompt_id_is_a_path": (
        "legacy_caches:\n  old:\n    path: old.pt\n    prompt_id: ../../etc\n",
        "legacy_caches.old.prompt_id: name '../../etc' is not allowed: it holds '/', a path separator",
    ),
    # The message names the policy the procedure needs, which configs/rolling-forcing.yaml sets.
    "rolling_forcing_under_global": (
        "generation:\n  procedure: rolling_forcing\n  cache_policy: global\n",
        "or set it to 'rolling_forcing'",
    ),
}


def _check(tmp_path, text: str) -> tuple[int, str]:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return cli_main(["check", str(path)]), str(path)


@pytest.mark.parametrize("case", sorted(BAD_CONFIG_FILES))
def test_sinkscope_check_refuses_in_one_line_naming_the_key(case, tmp_path, capsys):
    text, message = BAD_CONFIG_FILES[case]
    status, _ = _check(tmp_path, text)
    err = capsys.readouterr().err
    assert status == 2 and message in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "is empty"),
        ("- a\n- b\n", "must hold a mapping of config keys, not a list"),
        ("prompts: [unclosed\n", "is not valid YAML"),
    ],
)
def test_config_files_yaml_accepts_silently_are_refused(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as caught:
        read_config_file(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_a_folder_or_a_binary_file_is_not_a_config(tmp_path, capsys):
    assert cli_main(["check", str(tmp_path)]) == 2
    assert "is a folder, not a YAML file" in capsys.readouterr().err
    binary = tmp_path / "blob.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    assert cli_main(["check", str(binary)]) == 2
    assert "is not a text file" in capsys.readouterr().err


def test_layers_per_job_auto_means_one_generation_on_cuda_and_one_layer_on_the_cpu():
    assert resolve_layers_per_job("auto", 30, "cuda") == 30
    assert resolve_layers_per_job("auto", 30, "cuda:1") == 30
    assert resolve_layers_per_job("auto", 30, "cpu") == 1
    assert resolve_layers_per_job(4, 30, "cpu") == 4


def test_layers_per_job_auto_fills_max_job_memory_gib_on_cuda():
    """With max_job_memory_gib set, auto on CUDA captures the most layers whose job fits 90%
    of it; the GPU of the machine that reads the config plays no part."""
    from sinkscope.pipeline.resources import GIB, default_dtype, estimate_job_memory

    config, resolved = checked_config({"layers": [0, 1, 2, 3, 4, 5]})
    demo = resolved["demo"]
    dtype = default_dtype("cuda", demo.spec.dtype)
    estimates = [
        estimate_job_memory(
            demo.model_config, generation_options(config, "default", "demo"), dtype, captured_layers=n
        ).total
        for n in range(1, 7)
    ]
    assert estimates == sorted(estimates) and estimates[0] < estimates[-1]
    # Room for three layers in 90%, not for four.
    limit = (estimates[2] + estimates[3]) / 2 / 0.9
    limited = {**config, "max_job_memory_gib": limit / GIB}
    assert study_layers_per_job(limited, resolved, "cuda") == 3
    assert study_layers_per_job(config, resolved, "cuda") == 6  # no limit: every layer
    assert study_layers_per_job(limited, resolved, "cpu") == 1
    assert study_layers_per_job({**limited, "layers_per_job": 5}, resolved, "cuda") == 5
    # A job too large for the limit is refused, naming the layers_per_job that fits (a long
    # video, where each layer's statistics weigh: about 216 MiB a layer at 480 frames).
    config, resolved = checked_config(
        {"layers": [0, 1, 2, 3, 4, 5], "generation": {"num_frames": 480}, "layers_per_job": 6}
    )
    options = generation_options(config, "default", "demo")
    need = [estimate_job_memory(demo.model_config, options, dtype, captured_layers=n).total for n in (2, 3)]
    tight = {**config, "max_job_memory_gib": (need[0] + need[1]) / 2 / 0.9 / GIB}
    with pytest.raises(
        ConfigError, match=r"with 6 layers captured, more than max_job_memory_gib = .*set layers_per_job: 2"
    ):
        check_machine(tight, resolved, local=False)


def test_load_study_resolves_checkpoints_once_and_plans_the_groups():
    study = load_study({"layers": [0, 3, 1]})
    assert study.device == "cpu" and study.layer_groups == [[0], [3], [1]]
    assert set(study.checkpoints) == {"demo"} and study.encoders


@pytest.mark.workflow
def test_snakemake_refuses_what_sinkscope_check_refuses(workflow, tmp_path, capsys):
    """The same bad files through both entry points: the same key named, nothing run."""
    for case in (
        "duplicate_prompt",
        "nan_shift",
        "increasing_steps",
        "periodic_prompt_id",
        "first_k_past_video",
        "triton_on_cpu",
    ):
        text, message = BAD_CONFIG_FILES[case]
        status, _ = _check(tmp_path, text)
        assert status == 2 and message in capsys.readouterr().err
        (workflow.directory / "config.yaml").write_text(text)
        result = workflow.run("--dry-run", check=False)
        assert result.returncode != 0, case
        assert message in result.stderr, (case, result.stderr[-2000:])
        assert "Traceback" not in result.stderr, (case, result.stderr[-2000:])
        assert not (workflow.directory / "results").exists()


# -- weight files are opened far enough at config time ---------------------------------------


def _demo_state() -> dict:
    from fakes import tiny_state

    from sinkscope.model.config import get_model_config

    return tiny_state(config=get_model_config("demo"))


def _bad_weights(tmp_path, kind: str):
    """A weights file damaged or mistyped as a user's could be; (path, format, message)."""
    import argparse

    import torch
    from fakes import write_self_forcing_pt
    from safetensors.torch import save_file

    state = _demo_state()
    good = write_self_forcing_pt(tmp_path / "good.pt", state, ema_state=state)
    raw = good.read_bytes()
    path = tmp_path / f"{kind}.pt"
    if kind == "truncated":
        path.write_bytes(raw[: len(raw) * 2 // 3])
        return path, "self_forcing", "not a whole zip archive"
    if kind == "bit_flipped":
        damaged = bytearray(raw)
        damaged[len(raw) // 2] ^= 0x10  # inside a storage record
        path.write_bytes(bytes(damaged))
        return path, "self_forcing", "fails its CRC check"
    if kind == "pickled":
        write_self_forcing_pt(path, state, ema_state=state, extra={"args": argparse.Namespace(lr=1e-4)})
        return path, "self_forcing", "pickled objects beyond tensors (argparse.Namespace)"
    if kind == "generator_less":
        torch.save({"critic": {"w": torch.zeros(2)}, "step": 3}, path)
        return path, "self_forcing", "has none of 'generator_ema', 'generator', 'model'"
    if kind == "wrong_keys":
        torch.save({"generator_ema": {f"model.{k}x": v for k, v in state.items()}}, path)
        return path, "self_forcing", "does not fit the model"
    if kind == "wrong_model":
        from fakes import TINY, tiny_state

        write_self_forcing_pt(path, tiny_state(config=TINY), ema_state=tiny_state(config=TINY))
        return path, "self_forcing", "shape mismatches"
    if kind == "safetensors_wrong_tensors":
        path = tmp_path / "wrong.safetensors"
        save_file({k: v.contiguous() for k, v in list(state.items())[:-3]}, str(path))
        return path, "wan", "3 missing"
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    ["truncated", "bit_flipped", "pickled", "generator_less", "wrong_keys", "wrong_model", "safetensors_wrong_tensors"],
)
def test_damaged_or_wrong_weights_are_refused_at_config_time(tmp_path, kind):
    path, fmt, message = _bad_weights(tmp_path, kind)
    raw = {"checkpoints": {"mine": {"model": "demo", "format": fmt, "weights": str(path)}}}
    with pytest.raises(ConfigError, match="checkpoints.mine") as caught:
        load_study(raw, base_dir=tmp_path)
    assert message in str(caught.value) and str(path) in str(caught.value)


def test_whole_weights_pass_and_pickles_pass_when_allowed(tmp_path):
    path, fmt, _ = _bad_weights(tmp_path, "pickled")
    study = load_study(
        {"checkpoints": {"mine": {"model": "demo", "format": fmt, "weights": str(path), "allow_pickle": True}}},
        base_dir=tmp_path,
    )
    assert study.checkpoints["mine"].format == "self_forcing"
    assert load_study(
        {"checkpoints": {"mine": {"model": "demo", "weights": str(tmp_path / "good.pt")}}}, base_dir=tmp_path
    )


def test_parameter_shapes_match_the_model():
    import torch
    from fakes import TINY

    from sinkscope.model.config import WanConfig, get_model_config, parameter_shapes
    from sinkscope.model.wan import WanModel

    for config in (
        get_model_config("demo"),
        TINY,
        WanConfig(dim=64, ffn_dim=96, num_heads=4, num_layers=2, text_dim=32, qk_norm=False, cross_attn_norm=False),
    ):
        with torch.device("meta"):
            model = WanModel(config)
        assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == parameter_shapes(config)


@pytest.mark.parametrize("layer", [10**9, -1])
def test_a_legacy_cache_is_read_at_config_time_by_both_entry_points(tmp_path, capsys, layer):
    import torch
    from test_legacy import token_level_cache

    data = token_level_cache(layers=(0,), num_frames=6)
    data["attention_weights"][0]["layer_idx"] = layer
    torch.save(data, tmp_path / "old.pt")
    config = tmp_path / "config.yaml"
    config.write_text(f"legacy_caches:\n  old: {{path: {tmp_path / 'old.pt'}}}\n")
    assert cli_main(["check", str(config)]) == 2
    err = capsys.readouterr().err
    assert "legacy_caches.old" in err and "layer_idx" in err and "Traceback" not in err


def test_a_bit_flipped_legacy_cache_is_refused_at_config_time(tmp_path):
    import torch
    from test_legacy import token_level_cache

    path = tmp_path / "old.pt"
    torch.save(token_level_cache(layers=(0,), num_frames=6), path)
    damaged = bytearray(path.read_bytes())
    damaged[len(damaged) // 2] ^= 0x08
    path.write_bytes(bytes(damaged))
    with pytest.raises(ConfigError, match="legacy_caches.old: .*fails its CRC check"):
        load_study({"legacy_caches": {"old": {"path": str(path)}}}, base_dir=tmp_path)


@pytest.mark.workflow
def test_a_variant_inherits_the_base_generation_through_the_snakefile(workflow):
    """Snakemake's own schema check must fill no defaults into a variant (its missing keys
    come from generation:): a 3-frame base gives 3-frame variants."""
    import pyarrow.parquet as pq

    workflow.write_config(
        {
            "layers": [0],
            "generation": {"num_frames": 3},
            "capture": {"token_profiles": "none"},
            "variants": {"win": {"cache_policy": "window", "local_attn_frames": 3}},
        }
    )
    workflow.run("--until", "extract_attention")
    files = sorted(workflow.directory.glob("results/extract/demo@win/*/seed0/layers0/layer0.parquet"))
    assert files and pq.read_table(files[0], columns=["key_frame"]).column("key_frame").to_pylist()
    assert max(pq.read_table(files[0], columns=["query_frame"]).column("query_frame").to_pylist()) == 2


def _bad_frame_matrices() -> dict[str, tuple[dict, str]]:
    """Frame-matrix caches the import refuses for their values: what load_study must refuse too."""
    import math

    from test_legacy import frame_matrix_cache

    good, _ = frame_matrix_cache()
    nan = good["full_frame_attention"].clone()
    nan[3, 5, 2] = math.nan
    return {
        "NaN": ({**good, "full_frame_attention": nan}, "field full_frame_attention: holds 1 NaN"),
        "block layout": ({**good, "block_sizes": [1, 3]}, "field block_sizes: [1, 3] sum to 4 frames"),
        "head count": ({**good, "num_heads": int(good["num_heads"]) + 1}, "field num_heads: says"),
    }


@pytest.mark.parametrize("case", ["NaN", "block layout", "head count"])
def test_a_legacy_cache_the_import_refuses_is_refused_at_config_time(tmp_path, capsys, case):
    import torch

    from sinkscope.legacy.importer import import_cache

    data, message = _bad_frame_matrices()[case]
    path = tmp_path / "old.pt"
    torch.save(data, path)
    with pytest.raises(SinkscopeError, match=re.escape(message)):  # what sinkscope import-cache says at once
        import_cache(path, checkpoint="old")
    config = tmp_path / "config.yaml"
    config.write_text(f"legacy_caches:\n  old: {{path: {path}}}\n")
    assert cli_main(["check", str(config)]) == 2
    err = capsys.readouterr().err
    assert "legacy_caches.old" in err and message in err and "Traceback" not in err and err.count("\n") == 1


def test_a_token_level_cache_with_nan_is_refused_at_config_time(tmp_path):
    import math

    import torch
    from test_legacy import token_level_cache

    data = token_level_cache(layers=(0,), num_frames=6)
    data["attention_weights"][0]["attn_logits"][0, 1, 2, 3] = math.nan
    torch.save(data, tmp_path / "old.pt")
    with pytest.raises(ConfigError, match="legacy_caches.old: .*attn_logits: holds NaN or infinite values"):
        load_study({"legacy_caches": {"old": {"path": "old.pt"}}}, base_dir=tmp_path, check_this_machine=False)


@pytest.mark.parametrize(
    "override, message",
    [
        ("generation.num_frames=9", "snakemake --config takes no dotted keys; write generation='{num_frames: 9}'"),
        ("figures.heads=[L1H1]", "write figures='{heads: [L1H1]}'"),
        ("x=1", "'x' is not a key snakemake --config accepts"),
    ],
)
def test_check_takes_overrides_as_snakemake_config_does(tmp_path, capsys, override, message):
    path = tmp_path / "config.yaml"
    path.write_text("layers: [0]\n")
    assert cli_main(["check", str(path), override]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    # The nested form merges into the section, as Snakemake's update of its config does.
    assert cli_main(["check", "--show-config", str(path), "generation={num_frames: 9}", "figures={heads: [L1H1]}"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["generation"]["num_frames"] == 9 and config["generation"]["frames_per_block"] == 3
    assert config["figures"]["heads"] == ["L1H1"] and config["figures"]["step"] == "last"


# -- every problem at once, then a verdict ---------------------------------------------------------


def test_the_check_lists_every_problem_at_once(tmp_path):
    """A misspelled key, a NaN, a name that is a path, two missing files of one checkpoint,
    a head no model has, a missing legacy cache: one listing, one line each. What depends
    on a part that failed (the heads of a checkpoint that did not resolve) is left out."""
    raw = {
        "generation": {"num_frame": 9},
        "diagnostics": {"sink_ratio": math.nan},
        "prompts": {"../x": "a ball", "ok": "a ball"},
        "checkpoints": {
            "demo": {"model": "demo", "format": "self_forcing", "weights": "sinkscope:demo_trained.pt"},
            "real": {"format": "self_forcing", "weights": "real.pt", "base": "wan_models/Wan2.1-T2V-1.3B"},
        },
        "figures": {"heads": ["L7H1", "L5H13", "L1H1"]},
        "legacy_caches": {"old": {"path": "old.pt"}},
    }
    with pytest.raises(ConfigError) as error:
        load_study(raw, base_dir=tmp_path)
    starts = [
        "config key prompts: name '../x' is not allowed",
        "config key diagnostics.sink_ratio: nan is not a finite number",
        "unknown config key 'num_frame' in generation (did you mean 'num_frames'?)",
        "config key checkpoints.real: weights 'real.pt' do not exist",
        "config key checkpoints.real: base folder 'wan_models/Wan2.1-T2V-1.3B' does not exist",
        "config key figures.heads: 'L7H1' does not exist in checkpoint 'demo'",
        "config key figures.heads: 'L5H13' does not exist in checkpoint 'demo'",
        "config key legacy_caches.old.path: file 'old.pt' does not exist",
    ]
    problems = error.value.problems
    assert len(problems) == len(starts), problems
    for start in starts:
        assert sum(problem.startswith(start) for problem in problems) == 1, (start, problems)
    assert str(error.value) == "invalid config:\n  " + "\n  ".join(problems)


def test_the_jobs_console_line_of_a_listing_holds_every_problem():
    from sinkscope.pipeline.jobs import _one_line

    listing = ConfigError.invalid(["config key a: x", "config key b: y"])
    assert _one_line(listing, "log.txt") == "invalid config:\n  config key a: x\n  config key b: y"
    assert _one_line(SinkscopeError("first\nsecond"), "log.txt") == "first (more in log.txt)"


def test_the_machine_check_lists_each_capture_setting_the_device_cannot_run():
    config, resolved = checked_config({"device": "cpu", "capture": {"backend": "triton", "compile": True}})
    with pytest.raises(ConfigError) as error:
        check_machine(config, resolved)
    assert [line.split(":")[0] for line in error.value.problems] == [
        "config key capture.backend",
        "config key capture.compile",
    ]


def test_the_default_figure_heads_follow_the_layers_a_study_captures(tmp_path, capsys):
    """config.yaml's heads are the default pair: `layers=[0,1]` over it is a smaller study,
    whose L5H10 panel says the layer was not extracted; heads the user chose must be captured."""
    path = tmp_path / "config.yaml"
    path.write_text((REPO / "config.yaml").read_text())
    assert cli_main(["check", str(path), "layers=[0,1]"]) == 0
    capsys.readouterr()
    assert cli_main(["check", str(path), "layers=[0,1]", "figures={heads: [L1H1, L2H2, L5H10]}"]) == 2
    assert "figures.heads: 'L5H10' is in layer 4 (0-based)" in capsys.readouterr().err


def test_layers_per_job_past_the_study_layers_is_one_job_of_them_all():
    assert resolve_layers_per_job(2**63, 6, "cpu") == 6
    study = load_study({"layers": [0, 1], "layers_per_job": 2**63})
    assert study.layer_groups == [[0, 1]]


def test_extract_takes_every_dotted_set_as_check_takes_its_nested_form(tmp_path, monkeypatch, capsys):
    from unittest import mock

    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("layers: [0]\n")
    for sets in (["generation.num_frames=9"], ["generation.num_frames=9", "generation.cache_policy=window"]):
        with mock.patch("sinkscope.pipeline.extract.extract_job") as job:
            arguments = ["extract", "--out", "ext", "--force"] + [x for pair in sets for x in ("--set", pair)]
            assert cli_main(arguments) == 0, capsys.readouterr().err
        assert job.call_args.kwargs["generation"]["num_frames"] == 9
    # A dotted key reaches a name of one letter (Snakemake's own keys need two); a malformed one is named.
    with mock.patch("sinkscope.pipeline.extract.extract_job") as job:
        assert cli_main(["extract", "--out", "ext", "--force", "--set", "prompts.a=a ball"]) == 0
    assert job.call_args.kwargs["prompt_id"] == "a"
    assert cli_main(["extract", "--out", "ext", "--force", "--set", "generation..num_frames=9"]) == 2
    assert "'generation..num_frames' is not a dotted key" in capsys.readouterr().err
    status = cli_main(["extract", "--out", "ext", "--force", "--set", "generation.num_frames=nine"])
    err = capsys.readouterr().err
    assert status == 2 and "config key generation.num_frames: 'nine' is not an integer" in err
    assert "Traceback" not in err and err.count("\n") == 1
