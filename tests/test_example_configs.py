"""Every example config (configs/*.yaml) is a whole study: ``snakemake --configfile
configs/X.yaml`` plans that study alone (config.yaml is not read), and ``sinkscope check
configs/X.yaml`` refuses exactly what that planning refuses. Without its files each
example fails naming every missing file at once (weights, base folders, adapters); with
tiny stand-ins in the real formats at the paths its comments name (tests/fakes.py) both accept it, with the layers and
heads fitted to the stand-ins through --config as a user would override them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, Workflow
from fakes import TINY, tiny_state, write_self_forcing_pt, write_umt5, write_wan_folder
from safetensors.torch import save_file

from sinkscope.cli import main as cli_main
from sinkscope.model import MODEL_CONFIGS
from sinkscope.pipeline.configfile import read_config_file

EXAMPLES = sorted(path.stem for path in (REPO / "configs").glob("*.yaml"))
# Tiny stand-ins have 2 layers of 4 heads (the demo model 6 of 12): layers and heads that
# fit both, in snakemake --config syntax (sinkscope check takes the same).
TINY_FIT = ["layers=[0,1]", "figures={heads: [L1H1, L2H4]}"]


BROKEN_YAML = "seeds: [0\nlayers: [1]\n"


def example_file(name: str) -> Path:
    return REPO / "configs" / f"{name}.yaml"


def weights_files(name: str) -> dict[str, str]:
    """Checkpoint -> the weights file to download that the example names (a seeded demo
    model has none; weights shipped with the package, ``sinkscope:<file>``, need none)."""
    checkpoints = read_config_file(example_file(name))["checkpoints"]
    return {
        checkpoint: entry["weights"]
        for checkpoint, entry in checkpoints.items()
        if entry.get("weights") and not entry["weights"].startswith("sinkscope:")
    }


def missing_paths(name: str) -> list[str]:
    """The start of each line the check names without the example's files, in order: per
    checkpoint its weights, its base folder and its adapter."""
    checkpoints = read_config_file(example_file(name))["checkpoints"]
    lines = []
    for checkpoint, weights in weights_files(name).items():
        entry = checkpoints[checkpoint]
        lines.append(f"config key checkpoints.{checkpoint}: weights '{weights}' do not exist")
        if entry.get("base"):
            lines.append(f"config key checkpoints.{checkpoint}: base folder '{entry['base']}' does not exist")
        lora = entry.get("lora")
        lora = lora.get("path") if isinstance(lora, dict) else lora
        if lora:
            lines.append(f"config key checkpoints.{checkpoint}.lora: adapter '{lora}' does not exist")
    return lines


# Examples that run on the shipped demo (configs/interventions.yaml): nothing to download.
SHIPPED = [name for name in EXAMPLES if not weights_files(name)]


def write_stand_ins(root: Path, names: list[str]) -> None:
    """Tiny files in the real formats at every path the examples name: weights (a
    Self-Forcing .pt of the tiny Wan model, or of the demo model for `model: demo`; Krea's
    flat .safetensors for a .safetensors path), the
    Wan release folder with its umT5 encoder, LoRA adapters."""
    states = {}  # one state a model: the check reads names and shapes, not values
    for name in names:
        for entry in read_config_file(example_file(name))["checkpoints"].values():
            model = entry.get("model") or "tiny"
            if entry.get("weights") in weights_files(name).values() and not (root / entry["weights"]).exists():
                state = states.setdefault(model, tiny_state(20, TINY if model == "tiny" else MODEL_CONFIGS[model]))
                if entry["weights"].endswith(".safetensors"):  # Krea's flat dict, keys prefixed "model."
                    (root / entry["weights"]).parent.mkdir(parents=True, exist_ok=True)
                    save_file({f"model.{k}": v.contiguous() for k, v in state.items()}, str(root / entry["weights"]))
                else:
                    write_self_forcing_pt(root / entry["weights"], state, ema_state=state)
            if entry.get("base") and not (root / entry["base"]).exists():
                write_umt5(write_wan_folder(root / entry["base"], tiny_state(9)), "wan")
            if entry.get("base") and "reencode" in str(read_config_file(example_file(name)).get("generation")):
                (root / entry["base"] / "Wan2.1_VAE.pth").touch()  # Krea's re-encode: the check looks for the file
            lora = entry.get("lora")
            lora = lora.get("path") if isinstance(lora, dict) else lora
            if lora and not (root / lora).exists():
                module = "base_model.model.blocks.0.self_attn.q"
                adapter = {
                    f"{module}.lora_A.weight": torch.zeros(4, TINY.dim),
                    f"{module}.lora_B.weight": torch.zeros(TINY.dim, 4),
                }
                (root / lora).parent.mkdir(parents=True, exist_ok=True)
                torch.save({"generator_lora": adapter}, root / lora)


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stand_ins")
    write_stand_ins(root, EXAMPLES)
    return root


def check(name: str, directory: Path, monkeypatch, capsys, *overrides: str) -> tuple[int, str]:
    """`sinkscope check configs/X.yaml ...` run in ``directory``: (status, its one message)."""
    monkeypatch.chdir(directory)
    status = cli_main(["check", str(example_file(name)), *overrides])
    err = capsys.readouterr().err
    return status, err.split(": error: ", 1)[1].strip() if status else ""


def test_every_example_names_its_weights():
    assert len(EXAMPLES) >= 7 and len(SHIPPED) < len(EXAMPLES)
    for name in EXAMPLES:
        weights = [entry.get("weights") for entry in read_config_file(example_file(name))["checkpoints"].values()]
        assert any(weights), name


def test_an_example_on_the_shipped_demo_needs_no_files(tmp_path, monkeypatch, capsys):
    for name in SHIPPED:
        assert check(name, tmp_path, monkeypatch, capsys) == (0, ""), name


@pytest.mark.parametrize("name", sorted(set(EXAMPLES) - set(SHIPPED)))
def test_check_without_its_files_lists_every_missing_file_at_once(name, tmp_path, monkeypatch, capsys):
    status, message = check(name, tmp_path, monkeypatch, capsys)
    assert status == 2
    lines = message.removeprefix("invalid config:").strip().splitlines()
    expected = missing_paths(name)
    assert len(lines) == len(expected), message
    for line, start in zip(lines, expected):
        assert line.strip().startswith(start), line


@pytest.mark.parametrize("name", EXAMPLES)
def test_check_with_stand_ins_accepts_it(name, stand_ins, monkeypatch, capsys):
    assert check(name, stand_ins, monkeypatch, capsys, *TINY_FIT) == (0, "")


@pytest.mark.workflow
@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_snakemake_plans_the_example_alone_and_refuses_what_check_refuses(
    name, stand_ins, tmp_path, monkeypatch, capsys
):
    configfile = str(example_file(name))
    # Without its files: the same one-line messages as sinkscope check. The working
    # directory's config.yaml is not read at all (it is not even YAML here).
    (tmp_path / "config.yaml").write_text(BROKEN_YAML)
    if name not in SHIPPED:
        refused = Workflow(tmp_path).run("--dry-run", "--configfile", configfile, check=False)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr
        _, expected = check(name, tmp_path, monkeypatch, capsys)
        assert f"sinkscope: {expected}\n" in refused.stderr
    # With them: both accept, and the plan holds the example's checkpoints only (no demo
    # from config.yaml merged in).
    planned = Workflow(stand_ins).run("--dry-run", "--configfile", configfile, "--config", *TINY_FIT)
    extract = f"results/{name}/extract/"  # each example's own results folder
    extracted = {
        line.split(extract, 1)[1].split("/", 1)[0].split("@", 1)[0]  # a variant's source: <ckpt>@<variant>
        for line in planned.stdout.splitlines()
        if extract in line
    }
    assert extracted == set(read_config_file(example_file(name))["checkpoints"])
    assert check(name, stand_ins, monkeypatch, capsys, *TINY_FIT) == (0, "")


def test_no_profile_names_a_config_file():
    """A profile's configfile would count as given on the command line: the study would
    then be that file, not config.yaml or the --configfile a user gives."""
    for profile in (REPO / "profiles").glob("*/config.yaml"):
        keys = set(yaml.safe_load(profile.read_text()))
        assert not keys & {"configfile", "configfiles"}, profile


@pytest.mark.workflow
@pytest.mark.slow
def test_without_a_configfile_a_yaml_mistake_in_config_yaml_is_named_with_its_line(tmp_path):
    (tmp_path / "config.yaml").write_text(BROKEN_YAML)
    refused = Workflow(tmp_path).run("--dry-run", check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert (
        "sinkscope: config file 'config.yaml' is not valid YAML" in refused.stderr
        and "line 2, column 7" in refused.stderr
    )
