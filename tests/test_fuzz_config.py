"""The config check under random input (Hypothesis): configs drawn from the schema
(src/sinkscope/schemas/config.schema.yaml), every value now and then replaced by a wrong
type, NaN or infinity, a huge number, an odd string or random nesting; random edits
(``interventions``), variants, prompt schedules and ``extract --set`` overrides.

1. ``sinkscope check`` never ends in a traceback: it exits 0 with its one verdict line, or
   2 with its problems, one line each; ``extract --set`` (any form) refuses in one line or
   gets to the job.
2. What it accepts, ``snakemake -n`` accepts too, and a short CPU generation of it runs.

Profiles: ``ci`` (the default: a few hundred examples of property 1 in about a minute, a
few of property 2) and ``long`` (``HYPOTHESIS_PROFILE=long``). Each test prints how many
examples it ran. Nothing is kept between runs (no example database) and everything is
written under pytest's temporary folders. A failure found here becomes a regular test
(tests/test_study_checks.py, "found by the fuzz test").
"""

from __future__ import annotations

import contextlib
import io
import math
import os
from collections import Counter
from pathlib import Path
from unittest import mock

import pytest
import yaml
from conftest import Workflow
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sinkscope.cli import main as cli_main
from sinkscope.errors import ConfigError
from sinkscope.pipeline.study import load_study
from sinkscope.schema import load_schema, resolve_ref

settings.register_profile(
    "ci",
    max_examples=400,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
settings.register_profile("long", settings.get_profile("ci"), max_examples=8000)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)
# Property 2 runs Snakemake and a generation per example: a handful.
RUN_EXAMPLES = {"ci": 4, "long": 60}.get(PROFILE, 4)
OVERRIDE_EXAMPLES = {"ci": 150, "long": 3000}.get(PROFILE, 150)

SCHEMA = load_schema()

# -- odd values ------------------------------------------------------------------------------

ODD_STRINGS = [
    "",
    " ",
    "../../etc",
    "a/b",
    "a\\b",
    ".hidden",
    "demo@x",
    "layers0-3",
    "x.parquet",
    "x.damaged",
    "ü",
    "{a}",
    "*",
    "\t",
    "1e400",
    "nan",
    "-inf",
    "null",
    "true",
    "L0H1",
    "L99H99",
    "all",
    "class:sink",
    "random:sink:3",
    "sink",
    "cached",
    "noise",
    "-1",
    "9" * 25,
    "take_" + "0" * 20,
    "p" * 80,
]
odd_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1e300, 1e-320, 0.0, -0.0]),
    st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**30, 1e38, 3.5e38]),
    st.integers(-(2**70), 2**70),
    st.integers(-3, 40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(ODD_STRINGS),
    st.text(max_size=6),
)
odd_values = st.recursive(
    odd_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["a", "edit", "path", "heads", "1", "num_frames"]), inner, max_size=2),
    ),
    max_leaves=4,
)


def sometimes_odd(valid: st.SearchStrategy, odds: int) -> st.SearchStrategy:
    """``valid``, or one time in ``odds`` a wrong value of any kind (never for 0)."""
    if not odds:
        return valid
    return st.integers(0, odds - 1).flatmap(lambda roll: odd_values if roll == 0 else valid)


# -- values from the schema ------------------------------------------------------------------

NAMES = st.sampled_from(["demo", "a", "b2", "run.1", "x+y", "Demo", *ODD_STRINGS[:12]])


def _number(node: dict, integer: bool, odds: int) -> st.SearchStrategy:
    """Small numbers within the bounds; with odd values on, the bounds and one past them."""
    low = node.get("minimum", node.get("exclusiveMinimum", -5))
    high = node.get("maximum", node.get("exclusiveMaximum", low + 40))
    unbounded = "maximum" not in node and "exclusiveMaximum" not in node
    if integer:
        near = st.integers(int(low) + ("exclusiveMinimum" in node), int(min(high, low + 40)))
        edges = [int(low), int(high), int(low) - 1, int(high) + 1] + ([2**31, 2**63, 2**80] if unbounded else [])
        return st.one_of(near, near, st.sampled_from(edges)) if odds else near
    near = st.floats(min_value=float(low), max_value=float(min(high, low + 20)), allow_nan=False)
    if "exclusiveMinimum" in node:
        near = near.filter(lambda value: value > low)
    edges = [float(low), float(high)] + ([1e38, 1e300, 5e-324] if unbounded else [])
    return st.one_of(near, near, st.sampled_from(edges)) if odds else near


def from_schema(node: dict, key: str, odds: int) -> st.SearchStrategy:
    """Values for ``node``: valid ones (small, near the bounds), and one time in ``odds``
    an odd one."""
    node = resolve_ref(node)
    if key in SPECIAL:
        valid, wrong = SPECIAL[key]
        return sometimes_odd(valid if not odds else st.one_of(valid, valid, wrong), odds)
    options = node.get("anyOf") or node.get("oneOf")
    if options:
        return sometimes_odd(st.one_of([from_schema(option, key, odds) for option in options]), odds)
    if "enum" in node:
        return sometimes_odd(st.sampled_from(node["enum"]), odds)
    declared = node.get("type", [])
    types = [declared] if isinstance(declared, str) else list(declared)
    choices = []
    for kind in types:
        if kind == "null":
            choices.append(st.none())
        elif kind == "boolean":
            choices.append(st.booleans())
        elif kind == "integer":
            choices.append(_number(node, True, odds))
        elif kind == "number":
            choices.append(_number(node, False, odds))
        elif kind == "string":
            choices.append(st.sampled_from(["x", "a ball", "cpu", "L1H1", "L5H10"]))
        elif kind == "array":
            choices.append(st.lists(from_schema(node.get("items", {}), key + "[]", odds), min_size=0, max_size=3))
        elif kind == "object":
            choices.append(_object(node, key, odds))
    if not choices:
        return odd_values
    return sometimes_odd(st.one_of(choices), odds)


def _object(node: dict, key: str, odds: int) -> st.SearchStrategy:
    properties = node.get("properties", {})
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and not properties:  # a section of names
        names = NAMES if odds else st.sampled_from(["demo", "a", "b2", "run.1"])
        return st.dictionaries(names, from_schema(extra, key + ".*", odds), min_size=0, max_size=2)
    optional = {name: from_schema(sub, f"{key}.{name}" if key else name, odds) for name, sub in properties.items()}
    mapping = st.fixed_dictionaries({}, optional=optional)
    if not odds:
        return mapping
    misspelled = st.fixed_dictionaries({}, optional={**optional, "num_frame": st.integers(1, 9), "bogus": odd_values})
    return st.one_of(mapping, mapping, mapping, misspelled)


# Keys whose valid values the schema does not spell out (paths, heads, edits, models).
WEIGHTS = ["sinkscope:demo_trained.pt", "sinkscope:demo_periodic.pt", "sinkscope:nope.pt", "missing.pt", "../../etc"]
heads = st.one_of(
    st.sampled_from(["all", "L1", "class:sink", "random:local:2", "class:bogus"]),
    st.lists(st.sampled_from(["L1H1", "L2H3", "L6H12", "L7H1", "L1"]), min_size=1, max_size=3),
)
frames = st.one_of(st.sampled_from(["sink", "cached"]), st.lists(st.integers(0, 8), min_size=1, max_size=3))
edit = st.one_of(
    st.fixed_dictionaries({"edit": st.just("mask_keys"), "heads": heads, "key_frames": frames}),
    st.fixed_dictionaries(
        {
            "edit": st.just("logit_bias"),
            "heads": heads,
            "key_frames": frames,
            "bias": st.one_of(st.floats(-1e3, 1e3), st.sampled_from([0.0, 1e300, -1e300, 8e37, math.nan])),
        }
    ),
    st.fixed_dictionaries(
        {"edit": st.just("quantize_cache"), "format": st.sampled_from(["int8", "int4", "fp8_e4m3", "nvfp4", "fp3"])},
        optional={"tensors": st.sampled_from(["k", "v", "both", "q"])},
    ),
    st.fixed_dictionaries(
        {"edit": st.just("replace_frames"), "key_frames": frames, "source": st.sampled_from(["noise", 0, 1, "x"])}
    ),
)
schedule = st.lists(
    st.fixed_dictionaries({"text": st.sampled_from(["a ball", " ", "b"]), "start_frame": st.integers(0, 12)}),
    min_size=1,
    max_size=3,
)
# Keys whose values the schema does not spell out (paths, heads, edits, models): (valid
# values, wrong ones the schema lets through).
SPECIAL = {
    "checkpoints.*.weights": (st.sampled_from(WEIGHTS[:2]), st.sampled_from(WEIGHTS[2:])),
    "checkpoints.*.model": (st.sampled_from(["demo", None]), st.sampled_from(["gigantic", "wan2.1-t2v-1.3b"])),
    "checkpoints.*.format": (st.sampled_from(["self_forcing", "auto"]), st.sampled_from(["demo", "wan", "diffusers"])),
    "checkpoints.*.base": (st.none(), st.sampled_from(["missing_base", "."])),
    "checkpoints.*.lora": (st.none(), st.sampled_from(["missing_lora.pt", {"path": "x.pt", "rank": 0}])),
    "checkpoints.*.dtype": (st.sampled_from(["auto", "float32"]), st.sampled_from(["bfloat16", "float16"])),
    "prompts.*": (st.one_of(st.just("a ball"), schedule), st.sampled_from(["", "  "])),
    "generation.interventions": (st.none(), st.lists(edit, max_size=3)),
    "variants.*.interventions": (st.lists(edit, max_size=3), st.just([])),
    "checkpoints.*.generation.interventions": (st.none(), st.lists(edit, max_size=2)),
    "legacy_caches.*.path": (st.just("old.pt"), st.sampled_from(["missing.pt", "."])),
    "legacy_caches.*.prompt_id": (st.sampled_from([None, "p"]), st.sampled_from(["../../etc", ".x"])),
    "diagnostics.reference_labels": (st.sampled_from([None, "labels.csv"]), st.just("missing.csv")),
    "figures.heads": (
        st.lists(st.sampled_from(["L1H1", "L5H10", "L2H4"]), min_size=1, max_size=3),
        st.lists(st.sampled_from(["L7H1", "L1H13", "L0H1"]), max_size=3),
    ),
    "figures.highlight_layers": (st.one_of(st.none(), st.lists(st.integers(0, 5), max_size=2)), st.just([9])),
    "device": (st.sampled_from(["auto", "cpu"]), st.sampled_from(["cuda", "cuda:7", "tpu"])),
    "max_job_memory_gib": (st.sampled_from([None, 64.0]), st.sampled_from([1e-6, 0.01, 1e300, 1048577])),
    "layers": (st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True), st.just([0, 8])),
    "seeds": (st.lists(st.integers(0, 3), min_size=1, max_size=2, unique=True), st.just([0, 0])),
    "generation.num_frames": (st.integers(1, 24), st.just(65536)),
    "variants.*.num_frames": (st.integers(1, 24), st.just(0)),
    "generation.timestep_shift": (st.sampled_from([5.0, 1.0, 3.0]), st.sampled_from([1e-40, 1e308])),
    "diagnostics.first_k": (st.integers(1, 3), st.just(1000)),
}


# Per config, how often a value is odd: never (the schema's types; what still fails is
# the semantic checks'), rarely, often.
SECTIONS = {
    odds: {name: from_schema(node, name, odds) for name, node in SCHEMA["properties"].items()} for odds in (0, 40, 6)
}


@st.composite
def configs(draw) -> dict:
    """A raw config: a random subset of the sections, each drawn from the schema."""
    odds = draw(st.sampled_from(sorted(SECTIONS)))
    config = {}
    for name, strategy in SECTIONS[odds].items():
        if draw(st.integers(0, 2)) == 0:
            config[name] = draw(strategy)
    if odds and draw(st.integers(0, 9)) == 0:
        config[draw(st.sampled_from(["bogus", "generations", "1"]))] = draw(odd_values)
    return config


def _run_check(path: Path, *extra: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli_main(["check", *extra, str(path)])
        except SystemExit as exit_:  # argparse
            status = exit_.code
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A working directory holding the files some drawn configs name (a legacy cache, a
    label file); the checks' caches (.snakemake/) go here too."""
    import torch
    from test_legacy import token_level_cache

    folder = tmp_path_factory.mktemp("fuzz")
    torch.save(token_level_cache(layers=(0, 1), num_frames=6), folder / "old.pt")
    (folder / "labels.csv").write_text("\n".join(",".join(["1"] * 12) for _ in range(6)) + "\n")
    return folder


def _report(capsys, text: str) -> None:
    with capsys.disabled():
        print(f"\n{text}")


def test_check_never_ends_in_a_traceback(base, monkeypatch, capsys):
    monkeypatch.chdir(base)
    seen: Counter = Counter()

    @given(raw=configs(), show=st.booleans())
    def check(raw, show):
        path = base / "drawn.yaml"
        text = yaml.safe_dump(raw, sort_keys=False, allow_unicode=True) if raw else "{}\n"
        path.write_text(text, encoding="utf-8")
        status, out, err = _run_check(path, *(["--show-config"] if show else []))
        seen["examples"] += 1
        assert status in (0, 2), (status, err)
        assert "Traceback" not in err + out
        lines = err.rstrip("\n").splitlines()
        if status == 0:
            seen["accepted"] += 1
            assert len(lines) == 1 and ": valid: " in lines[0], err
        else:
            assert lines[0].startswith("sinkscope check: error: "), err
            assert all(line.startswith("  ") and line.strip() for line in lines[1:]), err

    check()
    _report(capsys, f"fuzz ({PROFILE}): sinkscope check ran {seen['examples']} configs, {seen['accepted']} accepted")
    assert seen["examples"] >= min(50, settings().max_examples)


OVERRIDE_KEYS = [
    "generation.num_frames",
    "generation.cache_policy",
    "generation",
    "layers",
    "seeds",
    "figures.heads",
    "figures",
    "variants",
    "generation.interventions",
    "checkpoints.demo.weights",
    "prompts",
    "device",
    "x",
    "1.2",
    "generation..num_frames",
    "generation.num_frames.x",
    "",
]
override_values = st.one_of(
    st.sampled_from(["9", "3", "0", "-1", "nan", "1e400", "[0, 1]", "[", "{num_frames: 9}", "{a: {b: 1}}", "", "null"]),
    st.sampled_from(ODD_STRINGS),
    st.text(max_size=10),
)
overrides = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(OVERRIDE_KEYS), override_values).map(lambda kv: f"{kv[0]}={kv[1]}"),
        st.text(max_size=12),
    ),
    min_size=1,
    max_size=3,
)


def test_extract_set_refuses_in_one_line_or_reaches_the_job(base, monkeypatch, capsys):
    """``sinkscope extract --set`` in every form: no traceback (the generation is replaced
    by a stand-in that records it was reached)."""
    monkeypatch.chdir(base)
    (base / "config.yaml").write_text("layers: [0]\ngeneration: {num_frames: 3}\n")
    seen: Counter = Counter()

    @settings(max_examples=OVERRIDE_EXAMPLES)
    @given(pairs=overrides)
    def extract(pairs):
        arguments = ["extract", "--out", str(base / "ext"), "--force"]
        for pair in pairs:
            arguments += ["--set", pair]
        out, err = io.StringIO(), io.StringIO()
        with (
            mock.patch("sinkscope.pipeline.extract.extract_job") as job,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            try:
                status = cli_main(arguments)
            except SystemExit as exit_:
                status = exit_.code
        seen["examples"] += 1
        assert "Traceback" not in err.getvalue()
        if status == 0:
            seen["reached"] += 1
            assert job.called
        else:
            assert status == 2 and err.getvalue().startswith("sinkscope extract: error: "), err.getvalue()

    extract()
    _report(
        capsys,
        f"fuzz ({PROFILE}): extract --set ran {seen['examples']} override lists, {seen['reached']} reached the job",
    )


# -- property 2: what the check accepts runs ---------------------------------------------------

small_generation_keys = {
    "denoising_steps": st.sampled_from([[1000], [1000, 500], [750, 250]]),
    "cache_policy": st.sampled_from(
        ["global", "window", "sink", "deep_sink", "participative_compression", "rerope_sink", "rolling_sink"]
        + ["relative_rope", "ema_sink"]
    ),
    "local_attn_frames": st.integers(1, 6),
    "sink_frames": st.integers(0, 2),
    "budget_frames": st.integers(1, 6),
    "recent_frames": st.integers(1, 4),
    "independent_first_frame": st.booleans(),
    "context_noise": st.sampled_from([0.0, 100.0]),
    "re_cache": st.booleans(),
}
small_generation = st.fixed_dictionaries(
    {"num_frames": st.integers(1, 6), "frames_per_block": st.integers(1, 3)}, optional=small_generation_keys
)
runnable = st.fixed_dictionaries(
    {
        "prompts": st.dictionaries(
            st.sampled_from(["a", "b"]), st.one_of(st.just("a ball"), schedule), min_size=1, max_size=1
        ),
        "seeds": st.just([0]),
        "layers": st.lists(st.integers(0, 5), min_size=1, max_size=2, unique=True),
        "generation": small_generation,
        "capture": st.fixed_dictionaries(
            {}, optional={"token_profiles": st.sampled_from(["none", "last_block", "all"])}
        ),
        "variants": st.dictionaries(
            st.sampled_from(["v1", "v2"]),
            st.fixed_dictionaries(
                {},
                optional={
                    "interventions": st.lists(edit, min_size=1, max_size=2),
                    **{key: small_generation_keys[key] for key in ("cache_policy", "local_attn_frames", "sink_frames")},
                },
            ),
            max_size=2,
        ),
    }
)


@pytest.mark.workflow
@pytest.mark.slow
def test_what_the_check_accepts_snakemake_plans_and_a_generation_runs(base, tmp_path_factory, monkeypatch, capsys):
    seen: Counter = Counter()

    @settings(max_examples=RUN_EXAMPLES * 12)
    @given(raw=runnable)
    def runs(raw):
        assume(seen["run"] < RUN_EXAMPLES)
        try:
            study = load_study(raw, base_dir=base)
        except ConfigError:
            seen["refused"] += 1
            assume(False)
        folder = tmp_path_factory.mktemp("run")
        (folder / "study.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        planned = Workflow(folder).run("--dry-run", "--configfile", "study.yaml", check=False)
        assert planned.returncode == 0 and "Traceback" not in planned.stderr, planned.stderr[-3000:]
        monkeypatch.chdir(folder)
        out, err = io.StringIO(), io.StringIO()
        layer = str(study.layers[0])
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = cli_main(["extract", "--config", "study.yaml", "--out", "ext", "--layers", layer])
        assert status == 0 and "Traceback" not in err.getvalue(), err.getvalue()[-3000:]
        assert (folder / "ext" / "manifest.json").is_file()
        seen["run"] += 1

    runs()
    _report(
        capsys,
        f"fuzz ({PROFILE}): {seen['run']} accepted configs planned by snakemake -n and generated "
        f"({seen['refused']} drawn were refused by the check)",
    )
    assert seen["run"] >= 1
