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


# The same study with sweeps: atlas runs (<checkpoint>@<sweep>/<item>, nested folders) in a
# job of several runs (a rule of its own), the pruning runs waiting for their head orders.
SWEPT = {
    **STUDY,
    "sweeps": {
        "heads": {"interventions": [{"edit": "mask_keys", "heads": "each", "key_frames": "sink"}], "over": "L2"},
        "prune": {
            "interventions": [{"edit": "mask_keys", "heads": "each", "key_frames": "cached"}],
            "over": "atlas:heads",
            "k": [2, 4],
        },
    },
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
            f"(?:{re.escape(part)}|[A-Za-z0-9_.@/-]+)" if re.fullmatch(r"\{\w+\}", part) else re.escape(part)
            for part in parts
        )
        + "$"
    )


@pytest.fixture(scope="module", params=["plain", "swept"])
def study_rules(request, tmp_path_factory) -> tuple[dict, dict[str, dict]]:
    study = STUDY if request.param == "plain" else SWEPT
    return study, dump_rules(tmp_path_factory.mktemp("layout"), study)


@pytest.fixture(scope="module")
def rules(study_rules) -> dict[str, dict]:
    return study_rules[1]


def test_every_rule_output_is_a_package_pattern_and_every_pattern_a_rule_output(study_rules):
    config, rules = study_rules
    folder = STUDY["results"]
    patterns = {name: pattern.replace(RESULTS_VAR, folder) for name, pattern in PATTERNS.items()}
    outputs = [output for name, rule in rules.items() if name != "all" for output in rule["output"]]
    unknown = [output for output in outputs if not any(_as_regex(p).match(output) for p in patterns.values())]
    assert not unknown, f"rule outputs that sinkscope.pipeline.layout does not list: {unknown}"
    # Each package pattern is written by a rule, wildcards kept or filled by names.
    unwritten = [name for name, p in patterns.items() if not any(_as_regex(p).match(o) for o in outputs)]
    # Only a study with a pruning sweep has head orders (its rule is made for it alone).
    assert unwritten == ([] if "sweeps" in config else ["head_orders"]), f"layout patterns no rule writes: {unwritten}"


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


def test_plain_inputs_are_files_the_study_plans(study_rules, tmp_path):
    from sinkscope.pipeline.study import load_study

    config, rules = study_rules
    study = load_study(config, base_dir=tmp_path)
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


def test_a_bad_results_folder_is_listed_with_the_configs_other_problems():
    from sinkscope.pipeline.config import check_config

    problems = check_config({"results": "../x", "seeds": [-1]}).problems
    assert any(line.startswith("config key results: '../x' climbs out with '..'") for line in problems), problems
    assert any(line.startswith("config key seeds[0]") for line in problems), problems


def test_the_jobs_of_several_runs_write_nested_folders_and_log_beside_them(tmp_path):
    """A sweep's runs are <checkpoint>@<sweep>/<item>: nested folders, written by the rules
    of the jobs of several runs (their logs per prompt and seed), the pruning runs' rule
    reading its head orders."""
    rules = dump_rules(tmp_path, SWEPT)
    folder = SWEPT["results"]
    jobs = {name: rule for name, rule in rules.items() if name.startswith("extract_runs_")}
    assert sorted(jobs) == [f"extract_runs_{n}" for n in (1, 2, 3, 4)]  # two a checkpoint
    first, pruning = jobs["extract_runs_1"], jobs["extract_runs_2"]
    assert f"{folder}/extract/demo@heads/L2H5/{{prompt}}/seed{{seed}}/layers1" in first["output"]
    assert not any(output.startswith(f"{folder}/extract/demo/") for output in first["output"])  # one a job
    assert first["log"] == [f"{folder}/logs/extract_runs/demo/job1/{{prompt}}/seed{{seed}}.log"]
    assert f"{folder}/atlas/demo/heads/head_orders.json" in pruning["input"]
    # Every layer an atlas selection may edit, in one generation (layers_per_job: auto on the CPU).
    assert f"{folder}/extract/demo@prune/random_k2/{{prompt}}/seed{{seed}}/layers0-1" in pruning["output"]
    # Atlas runs have no tables or figures: no rule's output names them but the extraction's.
    for name, rule in rules.items():
        if not name.startswith("extract_runs_"):
            assert not any("@heads" in output or "@prune" in output for output in rule["output"]), name
