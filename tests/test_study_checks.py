"""One check for everything: ``sinkscope check`` and the Snakefile run ``load_study`` and
refuse the same configs, at config time, each with one line naming the key or file."""

from __future__ import annotations

import pytest

from sinkscope.cli import main as cli_main
from sinkscope.errors import ConfigError
from sinkscope.pipeline.config import read_config_file, resolve_layers_per_job
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
    "increasing_steps": ("generation:\n  denoising_steps: [250, 1000]\n", "generation.denoising_steps: [250, 1000] must decrease"),
    "whitespace_prompt": ("prompts:\n  blank: '   '\n", "prompts.blank: the prompt is empty"),
    "seed_past_int64": ("seeds: [9223372036854775808]\n", "seeds[0]"),
    "highlight_layer_missing": ("figures:\n  highlight_layers: [99]\n", "figures.highlight_layers: [99] do not exist"),
    "first_k_past_video": ("diagnostics:\n  first_k: 1000\n", "diagnostics.first_k: 1000 frames are more"),
    "periodic_prompt_id": ("prompts:\n  take_00000000000000000000: a ball\n", "prompts.take_00000000000000000000"),
    "triton_on_cpu": ("device: cpu\ncapture:\n  backend: triton\n", "capture.backend: 'triton'"),
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


def test_load_study_resolves_checkpoints_once_and_plans_the_groups():
    study = load_study({"layers": [0, 3, 1]})
    assert study.device == "cpu" and study.layer_groups == [[0], [3], [1]]
    assert set(study.checkpoints) == {"demo"} and study.encoders


@pytest.mark.workflow
def test_snakemake_refuses_what_sinkscope_check_refuses(workflow, tmp_path, capsys):
    """The same bad files through both entry points: the same key named, nothing run."""
    for case in ("duplicate_prompt", "nan_shift", "increasing_steps", "periodic_prompt_id", "first_k_past_video",
                 "triton_on_cpu"):  # fmt: skip
        text, message = BAD_CONFIG_FILES[case]
        status, _ = _check(tmp_path, text)
        assert status == 2 and message in capsys.readouterr().err
        (workflow.directory / "config.yaml").write_text(text)
        result = workflow.run("--dry-run", check=False)
        assert result.returncode != 0, case
        assert message in result.stderr, (case, result.stderr[-2000:])
        assert "Traceback" not in result.stderr, (case, result.stderr[-2000:])
        assert not (workflow.directory / "results").exists()


