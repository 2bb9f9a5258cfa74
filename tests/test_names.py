"""One rule for the names the user chooses (sinkscope.names), asked wherever a name enters:
the config's sections, a legacy cache's prompt id, the command line's labels and the
legacy importer; the schema's propertyNames pattern is the same rule's."""

from __future__ import annotations

import re

import pytest
from conftest import REPO

from sinkscope.cli import main as cli_main
from sinkscope.errors import ConfigError
from sinkscope.names import (
    NAME_MAX_LENGTH,
    NAME_PATTERN,
    VARIANT_NAME_MAX_LENGTH,
    VARIANT_NAME_PATTERN,
    check_name,
    folded_collisions,
    name_problem,
    variant_name_problem,
)
from sinkscope.pipeline.config import normalize_config
from sinkscope.schema import load_schema

LONGEST = "".join("abcdefghijklmnopqrstuvwxyz"[i % 26] for i in range(NAME_MAX_LENGTH))
GOOD = ["demo", "self_forcing", "run.1", "x+y", "A-b_c.d", "7", "seed0", LONGEST]
# name -> what its refusal says
BAD = {
    "../../etc": "holds '/', a path separator",
    "a/b": "holds '/', a path separator",
    "a\\b": "holds '\\\\', a path separator (on Windows)",
    "a..b": "holds '..'",
    "..": "holds '..'",
    ".hidden": "starts with '.'",
    "demo@sink": "'@' joins a checkpoint and its variant",
    "a b": "holds ' '",
    "x:y": "holds ':'",
    "{prompt}": "holds '{', '}'",
    "ü": "holds 'ü'",
    "-x": "starts with '-'",
    "": "the name is empty",
    "p" * (NAME_MAX_LENGTH + 1): f"is longer than {NAME_MAX_LENGTH} characters",
    "take_" + "0" * 20: "ends in '0' repeated 20 times, which Snakemake refuses",
    "layers0-3": "reads as a folder sinkscope writes itself",
    "frames.parquet": "reads as a folder sinkscope writes itself",
    "demo.damaged-2": "reads as a folder sinkscope writes itself",
}


@pytest.mark.parametrize("name", GOOD)
def test_names_of_letters_digits_and_a_few_marks_are_taken(name):
    assert name_problem(name) is None and check_name(name, "config key prompts") == name
    assert re.match(NAME_PATTERN, name)


@pytest.mark.parametrize("name", sorted(BAD))
def test_names_that_are_not_one_path_part_are_refused_saying_why(name):
    problem = name_problem(name)
    assert problem is not None and BAD[name] in problem and "\n" not in problem
    with pytest.raises(ConfigError, match=re.escape(f"config key prompts: {problem}")):
        check_name(name, "config key prompts")


def test_a_name_must_be_a_string():
    assert name_problem(1) == "the name 1 is a int; names must be strings (write '1' in quotes)"


def test_the_schema_checks_names_with_the_same_pattern():
    schema = load_schema()
    sections = [name for name, node in schema["properties"].items() if "propertyNames" in node]
    assert sorted(sections) == ["checkpoints", "legacy_caches", "prompts", "sweeps", "variants"]
    for section in sections:
        expected = {"pattern": NAME_PATTERN, "maxLength": NAME_MAX_LENGTH}
        if section == "variants":  # <sweep>/<item>: two names, one slash
            expected = {"pattern": VARIANT_NAME_PATTERN, "maxLength": VARIANT_NAME_MAX_LENGTH}
        assert schema["properties"][section]["propertyNames"] == expected
    # What the pattern takes, the rule takes (the rule refuses a few more: Snakemake's, sinkscope's own).
    for name in [*GOOD, *BAD]:
        if name_problem(name) is None:
            assert re.match(NAME_PATTERN, name), name
    for name in [*GOOD, *BAD, *VARIANT_GOOD, *VARIANT_BAD]:
        if variant_name_problem(name) is None:
            assert re.match(VARIANT_NAME_PATTERN, name), name


VARIANT_GOOD = ["sink_per_head/L5H10", "cache_per_frame/f3", "mine/x.1", f"{LONGEST}/{LONGEST}"]
VARIANT_BAD = {
    "a/b/c": "holds '/', a path separator",
    "a//b": "holds '/', a path separator",
    "/b": "the name is empty",
    "a/..": "holds '..'",
    "a/.hidden": "starts with '.'",
    "a/layers0-3": "reads as a folder sinkscope writes itself",
    "demo@x/L1H1": "'@' joins a checkpoint and its variant",
}


@pytest.mark.parametrize("name", VARIANT_GOOD)
def test_a_variant_may_be_named_sweep_slash_item(name):
    assert variant_name_problem(name) is None
    assert name_problem(name) is not None  # every other name refuses the slash


@pytest.mark.parametrize("name", sorted(VARIANT_BAD))
def test_each_part_of_a_variant_name_follows_the_rule(name):
    problem = variant_name_problem(name)
    assert problem is not None and VARIANT_BAD[name] in problem, problem
    with pytest.raises(ConfigError, match=re.escape("config key variants")):
        normalize_config({"variants": {name: {"num_frames": 6}}})


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"checkpoints": {"../../etc": {"format": "demo", "model": "demo"}}}, "config key checkpoints"),
        ({"prompts": {"../../etc": "a ball"}}, "config key prompts"),
        ({"variants": {"../../etc": {"num_frames": 6}}}, "config key variants"),
        ({"legacy_caches": {"../../etc": {"path": "old.pt"}}}, "config key legacy_caches"),
        (
            {"legacy_caches": {"old": {"path": "old.pt", "prompt_id": "../../etc"}}},
            "config key legacy_caches.old.prompt_id",
        ),
    ],
)
def test_every_name_of_the_config_is_held_to_the_rule(raw, key, tmp_path):
    (tmp_path / "old.pt").write_bytes(b"")
    with pytest.raises(ConfigError) as error:
        normalize_config(raw, base_dir=tmp_path)
    line = f"{key}: name '../../etc' is not allowed: it holds '/', a path separator"
    assert any(problem.startswith(line) for problem in error.value.problems), error.value.problems


def test_a_file_shipped_in_the_package_is_named_not_reached_by_a_path(tmp_path):
    for key, entry in (
        ("weights", {"model": "demo", "weights": "sinkscope:../../pyproject.toml"}),
        ("lora", {"model": "demo", "weights": "sinkscope:demo_trained.pt", "lora": "sinkscope:../x.pt"}),
    ):
        with pytest.raises(ConfigError) as error:
            normalize_config({"checkpoints": {"demo": entry}}, base_dir=tmp_path)
        (line,) = error.value.problems  # the entry is not resolved past its refused name
        assert line.startswith(f"config key checkpoints.demo.{key}: 'sinkscope:../") and "holds '/'" in line


def test_names_one_folder_apart_only_in_case_are_refused(tmp_path):
    assert folded_collisions(["demo", "Demo", "other", "demo"]) == [("demo", "Demo")]
    with pytest.raises(ConfigError) as error:
        normalize_config(
            {"checkpoints": {name: {"format": "demo", "model": "demo"} for name in ("demo", "Demo")}},
            base_dir=tmp_path,
        )
    assert "config key checkpoints: 'demo' and 'Demo' differ only in letter case" in str(error.value)
    # The study adds the untouched default beside edited variants: 'Default' would share its folder.
    edit = [{"edit": "mask_keys", "heads": "all", "key_frames": [0]}]
    with pytest.raises(ConfigError, match="'default' and 'Default' differ only in letter case"):
        normalize_config({"variants": {"Default": {"interventions": edit}}}, base_dir=tmp_path)
    assert normalize_config({"variants": {"Default": {"num_frames": 6}}}, base_dir=tmp_path)  # no default added


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["import-cache", "old.pt", "--out", "x.parquet", "--checkpoint", "../../etc"], "argument --checkpoint: name"),
        (["import-cache", "old.pt", "--out", "x.parquet", "--prompt-id", "a/b"], "argument --prompt-id: name"),
        (["import-cache", "old.pt", "--out", "x.parquet", "--checkpoint", ".x"], "starts with '.'"),
        (["aggregate", "--input", "x", "--out", "t", "--name", "../x"], "argument --name: name"),
        (["aggregate", "--input", "x", "--out", "t", "--name", "a@b@c"], "argument --name: name 'a@b@c'"),
    ],
)
def test_command_line_labels_are_held_to_the_rule(arguments, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.pt").write_bytes(b"")
    with pytest.raises(SystemExit) as exit_:
        cli_main(arguments)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and err.count("\n") == 1
    assert sorted(path.name for path in tmp_path.iterdir()) == ["old.pt"]


def test_a_source_name_is_a_name_or_checkpoint_at_variant(tmp_path, monkeypatch, capsys):
    from sinkscope.arguments import source_name

    assert source_name("demo@sink_heads") == "demo@sink_heads" and source_name("demo") == "demo"


def test_the_legacy_importer_refuses_a_name_before_it_reads_the_file(tmp_path):
    from sinkscope.legacy.importer import import_cache

    for kwargs, key in (({"checkpoint": "../x"}, "checkpoint"), ({"checkpoint": "c", "prompt_id": ".p"}, "prompt_id")):
        with pytest.raises(ConfigError, match=f"^{key}: name"):
            import_cache(tmp_path / "never-read.pt", **kwargs)


def test_the_shipped_examples_names_pass():
    import yaml

    for path in sorted((REPO / "configs").glob("*.yaml")) + [REPO / "config.yaml"]:
        config = yaml.safe_load(path.read_text())
        for section in ("checkpoints", "prompts", "variants", "legacy_caches"):
            for name in config.get(section) or {}:
                assert name_problem(name) is None, (path.name, section, name)
