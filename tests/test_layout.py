"""The file tree under a results folder is defined once: the patterns the rules write in
rules/*.smk equal those of ``sinkscope.pipeline.layout`` (which the package's targets,
inputs, integrity and recovery use), in any results folder, and a source name holding a
``/`` (a sweep's variant) is nested folders in every one of them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import SNAKEFILE

from sinkscope.errors import ConfigError
from sinkscope.pipeline.layout import PATTERNS, RESULTS_VAR, path, results_folder

# The rules as Snakemake reads them: every rule's output, log and benchmark patterns and
# its inputs that are plain paths (not functions), loaded the way `snakemake --lint` does.
_DUMP_RULES = """
import json, sys
from pathlib import Path
sys.argv = ["snakemake", "--lint"]  # an inspection: no run-time checks fire
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings
with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
    workflow = api.workflow(
        ResourceSettings(), ConfigSettings(), snakefile=Path(sys.argv_snakefile), workdir=Path(".")
    )._workflow
    rules = {}
    for rule in workflow.rules:
        rules[rule.name] = {
            "output": [str(f) for f in rule.output],
            "log": [str(f) for f in rule.log],
            "benchmark": str(rule.benchmark) if rule.benchmark else None,
            "input": [str(f) for f in rule.input if not callable(f) and not f._is_callable],
        }
print("RULES" + json.dumps(rules))
"""

STUDY = {
    "results": "studies/first",
    # Two checkpoints: the study figures are drawn too.
    "checkpoints": {
        "demo": {"model": "demo", "format": "self_forcing", "weights": "sinkscope:demo_trained.pt"},
        "untrained": {"model": "demo", "format": "demo"},
    },
    "layers": [0, 1],
    "generation": {"num_frames": 6},
    "variants": {"no_sink": {"interventions": [{"edit": "mask_keys", "heads": "class:sink", "key_frames": [0]}]}},
    "outputs": {"contact_sheet": True},
    "figures": {"heads": ["L1H1", "L2H2"], "variant_kinds": ["figure4", "heads_heatmap"]},
}


def _without_constraints(pattern: str) -> str:
    """``{source,demo|demo@x}`` -> ``{source}``: the pattern as the rule file writes it."""
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] != "{":
            out.append(pattern[i])
            i += 1
            continue
        end, depth = i + 1, 1
        while depth:
            depth += {"{": 1, "}": -1}.get(pattern[end], 0)
            end += 1
        out.append("{" + pattern[i + 1 : end - 1].split(",", 1)[0] + "}")
        i = end
    return "".join(out)


def dump_rules(directory: Path, config: dict) -> dict[str, dict]:
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    script = _DUMP_RULES.replace("sys.argv_snakefile", repr(str(SNAKEFILE)))
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=directory, capture_output=True, text=True, env=dict(os.environ)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rules = json.loads(result.stdout.split("RULES", 1)[1])
    for rule in rules.values():
        for key in ("output", "log", "input"):
            rule[key] = [_without_constraints(entry) for entry in rule[key]]
        rule["benchmark"] = rule["benchmark"] and _without_constraints(rule["benchmark"])
    return rules


def _as_regex(pattern: str) -> re.Pattern:
    """A package pattern, each wildcard either kept as a wildcard or filled by a name."""
    parts = re.split(r"(\{\w+\})", pattern)
    return re.compile(
        "".join(
            f"(?:{re.escape(part)}|[A-Za-z0-9_.@-]+)" if re.fullmatch(r"\{\w+\}", part) else re.escape(part)
            for part in parts
        )
        + "$"
    )


@pytest.fixture(scope="module")
def rules(tmp_path_factory) -> dict[str, dict]:
    return dump_rules(tmp_path_factory.mktemp("layout"), STUDY)


def test_every_rule_output_is_a_package_pattern_and_every_pattern_a_rule_output(rules):
    folder = STUDY["results"]
    patterns = {name: pattern.replace(RESULTS_VAR, folder) for name, pattern in PATTERNS.items()}
    outputs = [output for name, rule in rules.items() if name != "all" for output in rule["output"]]
    unknown = [output for output in outputs if not any(_as_regex(p).match(output) for p in patterns.values())]
    assert not unknown, f"rule outputs that sinkscope.pipeline.layout does not list: {unknown}"
    # Each package pattern is written by a rule, wildcards kept or filled by names.
    unwritten = [name for name, p in patterns.items() if not any(_as_regex(p).match(o) for o in outputs)]
    assert not unwritten, f"layout patterns no rule writes: {unwritten}"


def test_logs_and_benchmarks_sit_in_the_results_folder_beside_their_outputs(rules):
    folder = STUDY["results"]
    for name, rule in rules.items():
        if name == "all":
            continue
        wildcards = set(re.findall(r"\{(\w+)\}", rule["output"][0]))
        assert rule["log"] and rule["benchmark"], name
        for log in rule["log"]:
            assert log.startswith(f"{folder}/logs/") and set(re.findall(r"\{(\w+)\}", log)) == wildcards, log
        assert rule["benchmark"].startswith(f"{folder}/benchmarks/"), rule["benchmark"]


def test_plain_inputs_are_files_the_study_plans(rules, tmp_path):
    from sinkscope.pipeline.study import load_study

    study = load_study(STUDY, base_dir=tmp_path)
    planned = set(study.all_targets())
    for name, rule in rules.items():
        if name == "all":
            assert set(rule["input"]) == planned
            continue
        stray = [entry for entry in rule["input"] if entry not in planned]
        assert not stray, f"rule {name} reads files the study does not plan: {stray}"


def test_the_package_fills_a_pattern_in_any_results_folder():
    assert path("table", table="head_stats") == "results/tables/head_stats.parquet"
    assert (
        path("extract_dir", "/scratch/me/run", source="demo@sweep/L5H10", prompt="drift", seed=0, group="0-5")
        == "/scratch/me/run/extract/demo@sweep/L5H10/drift/seed0/layers0-5"
    )


@pytest.mark.parametrize(
    ("given", "folder"),
    [("results", "results"), ("results/", "results"), ("./results/interventions", "results/interventions")],
)
def test_results_folder_is_normalized(given, folder):
    assert results_folder(given) == folder


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (".", "working directory itself"),
        ("", "working directory itself"),
        ("../elsewhere", "'..'"),
        ("results/{x}", "reserve"),
        (".snakemake/results", ".snakemake"),
    ],
)
def test_results_folder_refuses_what_cannot_hold_a_study(given, says):
    with pytest.raises(ConfigError, match=re.escape(says)) as error:
        results_folder(given)
    assert str(error.value).startswith("invalid config: config key results:")


# A sweep's variant `<sweep>/<item>` makes a source `<checkpoint>@<sweep>/<item>`: every
# pattern, wildcard constraint and log path must carry the `/`. Sweeps are not built yet,
# so the source names are made so here.
_NESTED_DRY_RUN = """
import sys
from sinkscope.pipeline.grid import StudyGrid
StudyGrid.source_name = staticmethod(lambda c, v: c if v == "default" else f"{c}@{v}/item")
from snakemake.cli import main
sys.argv[0] = "snakemake"
main()
"""


@pytest.mark.workflow
def test_a_source_name_with_a_slash_is_planned_as_nested_folders(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(STUDY))
    command = [sys.executable, "-c", _NESTED_DRY_RUN, "--snakefile", str(SNAKEFILE), "-n", "--cores", "1"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=dict(os.environ))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    planned = result.stdout
    folder = STUDY["results"]
    for expected in (
        f"{folder}/extract/demo@no_sink/item/drift/seed0/layers1",
        f"{folder}/logs/extract_attention/demo@no_sink/item/drift/seed0/layers1.log",
        f"{folder}/tables/checkpoints/demo@no_sink/item/head_stats.parquet",
        f"{folder}/figures/demo@no_sink/item/figure4.svg",
        f"{folder}/figures/demo@no_sink/item/layer1/heads_heatmap.png",
    ):
        assert expected in planned, expected
    assert not Path(tmp_path, folder).exists()
