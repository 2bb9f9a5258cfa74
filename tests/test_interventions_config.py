"""generation.interventions as planning sees it: parsing, canonical params, the config
check's one-line refusals, the implicit default variant, and the class: selections'
head classes (planned as a job input, written and read back)."""

from __future__ import annotations

import copy

import pytest

from sinkscope.errors import ConfigError, DamagedFileError
from sinkscope.interventions import (
    CACHE_FORMAT_NAMES,
    CACHE_TENSORS,
    HEAD_CLASS_LABELS,
    FrameSelection,
    HeadSelection,
    LogitBias,
    MaskKeys,
    QuantizeCache,
    ReplaceFrames,
    class_selections,
    edited_heads,
    parse_interventions,
    read_head_classes,
    with_head_classes,
    write_head_classes,
)
from sinkscope.options import PROCEDURE_TABLE, GenerationOptions
from sinkscope.pipeline.study import load_study, path
from sinkscope.schema import load_schema

BASE = {
    "checkpoints": {"demo": {"model": "demo", "format": "demo"}},
    "prompts": {"drift": "a ball drifting left to right"},
    "seeds": [0],
    "layers": [0, 4],
    "generation": {"num_frames": 9},
}


def _study(variants: dict, **top):
    config = {**copy.deepcopy(BASE), **top, "variants": variants}
    return load_study(config, check_this_machine=False)


def _refusal(variants: dict, **top) -> str:
    with pytest.raises(ConfigError) as error:
        _study(variants, **top)
    return str(error.value)


# -- parsing ---------------------------------------------------------------------------------------


def test_every_edit_parses_to_its_dataclass_with_its_config_name():
    edits = parse_interventions(
        [
            {"edit": "mask_keys", "heads": ["L1H1", "L5H10"], "key_frames": [0]},
            {"edit": "logit_bias", "heads": "all", "key_frames": "sink", "bias": -2},
            {"edit": "quantize_cache", "format": "nvfp4", "tensors": "k"},
            {"edit": "replace_frames", "key_frames": [3, 4], "source": "noise"},
            {"edit": "replace_frames", "key_frames": "cached", "source": "noise"},
        ],
        "x",
    )
    assert [type(edit) for edit in edits] == [MaskKeys, LogitBias, QuantizeCache, ReplaceFrames, ReplaceFrames]
    assert [edit.edit for edit in edits] == [
        "mask_keys",
        "logit_bias",
        "quantize_cache",
        "replace_frames",
        "replace_frames",
    ]
    assert edits[0].heads == HeadSelection("list", heads=((0, 0), (4, 9)))
    assert edits[1].heads.kind == "all" and edits[1].key_frames == FrameSelection("sink") and edits[1].bias == -2.0
    assert edits[2] == QuantizeCache("nvfp4", "k")
    assert edits[3].key_frames == FrameSelection("list", (3, 4)) and edits[4].key_frames.kind == "cached"
    assert parse_interventions(None, "x") == () == parse_interventions([], "x")


@pytest.mark.parametrize(
    "heads, kind, resolved",
    [
        ("all", "all", {(layer, head) for layer in range(3) for head in range(2)}),
        ("L2", "layer", {(1, 0), (1, 1)}),
        (["L3", "L2"], "layer", {(1, 0), (1, 1), (2, 0), (2, 1)}),
        ("L1H2", "list", {(0, 1)}),
        (["L1H1", "L2", "L2H1"], "list", {(0, 0), (1, 0), (1, 1)}),
        ("class:sink?", "class", {(2, 1)}),
    ],
)
def test_head_selections_resolve_to_their_heads(heads, kind, resolved):
    selection = parse_interventions([{"edit": "mask_keys", "heads": heads, "key_frames": [0]}], "x")[0].heads
    classes = {(0, 0): "sink", (2, 1): "sink?", (1, 1): "local"}
    assert selection.kind == kind
    assert selection.resolve(3, 2, classes) == frozenset(resolved)


def test_equal_configs_give_equal_canonical_params():
    spelled = [
        [
            {"edit": "mask_keys", "heads": ["L5H10", "L1H1", "L1H1"], "key_frames": [4, 0, "4"]},
            {"edit": "logit_bias", "heads": ["L2H3", "L2"], "key_frames": 0, "bias": "-0.0"},
            {"edit": "quantize_cache", "format": "int8"},
        ],
        [
            {"edit": "mask_keys", "heads": ["L1H1", "L5H10"], "key_frames": [0, 4]},
            {"edit": "logit_bias", "heads": "L2", "key_frames": [0], "bias": 0},
            {"edit": "quantize_cache", "format": "int8", "tensors": "both"},
        ],
    ]
    options = [GenerationOptions.from_config({"interventions": edits}) for edits in spelled]
    assert options[0] == options[1] and hash(options[0]) == hash(options[1])
    assert options[0].to_dict() == options[1].to_dict()
    assert options[0].to_dict()["interventions"] == [
        {"edit": "mask_keys", "heads": ["L1H1", "L5H10"], "key_frames": [0, 4]},
        {"edit": "logit_bias", "heads": "L2", "key_frames": [0], "bias": 0.0},
        {"edit": "quantize_cache", "format": "int8", "tensors": "both"},
    ]
    # The params read back give the same options (the job parses what the rule passes).
    assert GenerationOptions.from_config(options[0].to_dict()) == options[0]


def test_no_edits_are_today_params():
    plain = GenerationOptions.from_config({})
    assert (
        GenerationOptions.from_config({"interventions": []})
        == plain
        == GenerationOptions.from_config({"interventions": None})
    )
    assert "interventions" not in plain.to_dict() and plain.interventions == ()


@pytest.mark.parametrize(
    "edits, message",
    [
        (
            [{"edit": "mask_key", "heads": "all", "key_frames": [0]}],
            "[0].edit: 'mask_key' is not one of mask_keys, logit_bias, "
            "quantize_cache, replace_frames (did you mean 'mask_keys'?)",
        ),
        (
            [{"edit": "mask_keys", "hedas": "all", "key_frames": [0]}],
            "[0]: unknown key 'hedas' for mask_keys (did you mean 'heads'?)",
        ),
        ([{"edit": "mask_keys", "heads": "all", "key_frames": [0], "bias": 1}], "[0].bias: mask_keys takes no bias"),
        ([{"edit": "logit_bias", "heads": "all", "key_frames": [0]}], "[0]: logit_bias needs bias"),
        ([{"heads": "all"}], "[0]: an edit needs 'edit'"),
        (
            [{"edit": "mask_keys", "heads": "L0H1", "key_frames": [0]}],
            "[0].heads: 'L0H1' is not a head like 'L1H1' or a layer",
        ),
        (
            [{"edit": "mask_keys", "heads": "class:snk", "key_frames": [0]}],
            "[0].heads: 'class:snk': 'snk' is not a head class (did you mean 'sink'?)",
        ),
        (
            [{"edit": "mask_keys", "heads": "all", "key_frames": "snik"}],
            "[0].key_frames: 'snik' is not a latent frame (0, 1, ...) (did you mean 'sink'?)",
        ),
        ([{"edit": "mask_keys", "heads": "all", "key_frames": [-1]}], "[0].key_frames: -1 is not a latent frame"),
        (
            [{"edit": "logit_bias", "heads": "all", "key_frames": [0], "bias": float("nan")}],
            "[0].bias: nan is not a finite number",
        ),
        (
            [{"edit": "quantize_cache", "format": "nvfp"}],
            "[0].format: 'nvfp' is not one of int8, int4, fp8_e4m3, nvfp4, nvfp4_4over6 (did you mean 'nvfp4'?)",
        ),
        ([{"edit": "quantize_cache", "format": "int8", "tensors": "kv"}], "[0].tensors: 'kv' is not one of k, v, both"),
        (
            [{"edit": "quantize_cache", "format": "int8"}, {"edit": "quantize_cache", "format": "int4"}],
            "[1]: a second quantize_cache edit",
        ),
        (
            [{"edit": "replace_frames", "key_frames": [3], "source": "nosie"}],
            "[0].source: 'nosie' is not 'noise' or a latent frame (did you mean 'noise'?)",
        ),
        (["mask_keys"], "[0]: 'mask_keys' is not an edit like {edit: mask_keys"),
        ("mask_keys", "where: 'mask_keys' is not a list of edits"),
    ],
)
def test_a_bad_edit_is_refused_in_one_line_naming_where(edits, message):
    with pytest.raises(ConfigError) as error:
        parse_interventions(edits, "where")
    assert message in str(error.value) and "\n" not in str(error.value)
    assert str(error.value).startswith("config key where")


# -- the config check: one line naming the variant and the key --------------------------------------


def test_every_bad_edit_of_a_list_is_named_at_once():
    edits = [
        {"edit": "frob"},
        {"edit": "mask_keys", "heads": 7, "key_frames": [0]},
        {"edit": "mask_keys", "heads": "all", "key_frames": [0]},
        {"edit": "mask_keys", "heads": "all"},
    ]
    with pytest.raises(ConfigError) as refused:
        parse_interventions(edits, "variants.v.interventions")
    assert [line.split(":")[0] for line in refused.value.problems] == [
        "config key variants.v.interventions[0].edit",
        "config key variants.v.interventions[1].heads",
        "config key variants.v.interventions[3]",
    ]


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            {"edit": "mask_keys", "heads": ["L99H1"], "key_frames": [0]},
            "config key variants.bad.interventions[0].heads: L99H1 is not a head of demo (checkpoint 'demo': 6 "
            "layers, 12 heads)",
        ),
        (
            {"edit": "logit_bias", "heads": ["L1H13"], "key_frames": [0], "bias": 1.0},
            "variants.bad.interventions[0].heads: L1H13 is not a head of demo",
        ),
        (
            {"edit": "mask_keys", "heads": "L7", "key_frames": [0]},
            "variants.bad.interventions[0].heads: L7 is not a layer of demo",
        ),
        (
            {"edit": "mask_keys", "heads": "all", "key_frames": [0, 30]},
            "variants.bad.interventions[0].key_frames: frame 30 is past the video's last frame 8",
        ),
        (
            {"edit": "mask_keys", "heads": "all", "key_frames": [7]},
            "variants.bad.interventions[0].key_frames: frame 7 is in the last block (frames 6-8)",
        ),
        (
            {"edit": "replace_frames", "key_frames": [3, 4], "source": 4},
            "variants.bad.interventions[0].source: frame 4 must be earlier than every frame it replaces (key_frames "
            "[3, 4])",
        ),
        (
            {"edit": "replace_frames", "key_frames": "sink", "source": 0},
            "variants.bad.interventions[0].source: frame 0 must be earlier than every frame it replaces, and "
            "key_frames 'sink'",
        ),
        (
            {"edit": "mask_key", "heads": "all", "key_frames": [0]},
            "config key variants.bad.interventions[0].edit: 'mask_key' is not one of 'mask_keys', 'logit_bias', "
            "'quantize_cache', 'replace_frames' (did you mean 'mask_keys'?)",
        ),
        (
            {"edit": "mask_keys", "hedas": "all", "key_frames": [0]},
            "unknown config key 'hedas' in variants.bad.interventions[0] (did you mean 'heads'?)",
        ),
    ],
)
def test_the_study_check_refuses_edits_the_model_or_video_lacks(edit, message):
    text = _refusal({"bad": {"interventions": [edit]}})
    assert message in text and "\n" not in text, text


def test_strings_from_the_command_line_are_coerced():
    # snakemake --config gives nested values as strings
    study = _study(
        {
            "v": {
                "interventions": [
                    {"edit": "logit_bias", "heads": "L1H1", "key_frames": ["0", "3"], "bias": "-1.5"},
                    {"edit": "replace_frames", "key_frames": "sink", "source": "noise"},
                    {"edit": "replace_frames", "key_frames": ["4"], "source": "2"},
                ]
            }
        }
    )
    assert study.extract_params("demo@v", "0")["generation"]["interventions"] == [
        {"edit": "logit_bias", "heads": ["L1H1"], "key_frames": [0, 3], "bias": -1.5},
        {"edit": "replace_frames", "key_frames": "sink", "source": "noise"},
        {"edit": "replace_frames", "key_frames": [4], "source": 2},
    ]
    text = _refusal({"v": {"interventions": [{"edit": "mask_keys", "heads": "all", "key_frames": "snik"}]}})
    assert (
        "config key variants.v.interventions[0].key_frames: 'snik' is not a latent frame (0, 1, ...) (did you mean "
        "'sink'?)" in text
    ), text


def test_edits_under_a_procedure_that_cannot_run_them_are_refused():
    assert PROCEDURE_TABLE["rolling_forcing"].supports_interventions is False
    variant = {
        "procedure": "rolling_forcing",
        "num_frames": 15,
        "local_attn_frames": 15,
        "sink_frames": 3,
        "interventions": [{"edit": "quantize_cache", "format": "int8"}],
    }
    text = _refusal({"rf": variant})
    assert "config key variants.rf.interventions: procedure 'rolling_forcing' cannot apply edits" in text, text


@pytest.mark.parametrize("policy", ["rerope_sink", "rolling_sink"])
def test_cache_edits_under_a_policy_that_rebuilds_its_keys_are_refused_at_the_check(policy):
    """Those policies rebuild stored keys from an un-roped copy of their own: a cache edit
    would not reach them. Refused before any job, naming the variant and the edit."""
    variant = {
        "cache_policy": policy,
        "local_attn_frames": 9,
        "sink_frames": 3,
        "interventions": [{"edit": "quantize_cache", "format": "int8"}],
    }
    text = _refusal({"q": variant})
    assert (
        f"config key variants.q.interventions[0]: cache_policy '{policy}' re-ropes keys from its own un-roped "
        "copy, which quantize_cache does not reach"
    ) in text, text
    # An attention edit is fine there.
    variant["interventions"] = [{"edit": "mask_keys", "heads": "all", "key_frames": [0]}]
    load_study({"variants": {"m": variant}})


@pytest.mark.parametrize(
    "where, config",
    [
        (
            "generation.interventions",
            {"generation": {"num_frames": 9, "interventions": [{"edit": "quantize_cache", "format": "int8"}]}},
        ),
        (
            "checkpoints.demo.generation.interventions",
            {
                "checkpoints": {
                    "demo": {
                        "model": "demo",
                        "format": "demo",
                        "generation": {"interventions": [{"edit": "quantize_cache", "format": "int8"}]},
                    }
                }
            },
        ),
    ],
)
def test_edits_outside_variants_are_refused(where, config):
    text = _refusal({"plain": {"num_frames": 9}}, **config)
    assert f"config key {where}: edits belong in variants:" in text and "\n" not in text, text


def test_a_default_variant_takes_no_edits():
    text = _refusal({"default": {"interventions": [{"edit": "quantize_cache", "format": "int8"}]}})
    assert "config key variants.default.interventions: edits belong in variants:" in text, text


# -- the implicit default variant ---------------------------------------------------------------------


def test_edited_variants_get_the_untouched_default_as_their_control():
    study = _study(
        {
            "identity": {"interventions": [{"edit": "logit_bias", "heads": "all", "key_frames": [0], "bias": 0.0}]},
            "no_sink": {"interventions": [{"edit": "mask_keys", "heads": ["L1H1", "L5H10"], "key_frames": [0]}]},
            "kv_int8": {"interventions": [{"edit": "quantize_cache", "format": "int8", "tensors": "both"}]},
        }
    )
    assert study.variants == ["default", "identity", "no_sink", "kv_int8"]
    assert study.options["demo"] == GenerationOptions.from_config({"num_frames": 9})
    assert "interventions" not in study.extract_params("demo", "0")["generation"]
    params = study.extract_params("demo@no_sink", "0")["generation"]
    assert params["interventions"] == [{"edit": "mask_keys", "heads": ["L1H1", "L5H10"], "key_frames": [0]}]
    assert {key: value for key, value in params.items() if key != "interventions"} == study.extract_params("demo", "0")[
        "generation"
    ]


def test_no_implicit_default_without_edits_or_beside_a_named_one():
    assert _study({"short": {"num_frames": 6}, "long": {"num_frames": 9}}).variants == ["short", "long"]
    named = _study(
        {"kv": {"interventions": [{"edit": "quantize_cache", "format": "int4"}]}, "default": {"num_frames": 9}}
    )
    assert named.variants == ["kv", "default"]
    # An empty list edits nothing: the variant would be the untouched run again; refused.
    assert "config key variants.plain.interventions: an empty list edits nothing" in _refusal(
        {"plain": {"interventions": []}}
    )


# -- class: selections -----------------------------------------------------------------------------------


def test_only_the_jobs_of_class_selections_wait_for_the_head_classes():
    study = _study(
        {
            "no_sink": {"interventions": [{"edit": "mask_keys", "heads": "class:sink", "key_frames": [0]}]},
            "kv_int8": {"interventions": [{"edit": "quantize_cache", "format": "int8"}]},
        }
    )
    classes = path("intervention_classes", checkpoint="demo")
    assert classes == "results/interventions/demo/head_classes.json"
    assert study.head_classes_inputs("demo@no_sink") == [classes]
    assert study.head_classes_inputs("demo@kv_int8") == [] == study.head_classes_inputs("demo")
    assert study.head_classes_diagnostics("demo") == "results/tables/checkpoints/demo/head_diagnostics.parquet"
    assert classes in study.all_targets() and study.class_checkpoints == ["demo"]
    assert study.extract_params("demo@no_sink", "0")["generation"]["interventions"][0]["heads"] == "class:sink"
    plain = _study({"kv_int8": {"interventions": [{"edit": "quantize_cache", "format": "int8"}]}})
    assert plain.class_checkpoints == [] and not any("interventions/" in target for target in plain.all_targets())


def test_with_head_classes_turns_class_selections_into_lists():
    edits = parse_interventions(
        [
            {"edit": "mask_keys", "heads": "class:sink", "key_frames": [0]},
            {"edit": "logit_bias", "heads": "class:local?", "key_frames": "cached", "bias": 1.5},
            {"edit": "quantize_cache", "format": "int4"},
        ],
        "x",
    )
    assert class_selections(edits) == ["sink", "local?"]
    classes = {(0, 3): "sink", (4, 1): "sink", (4, 2): "local?", (0, 0): "diffuse"}
    resolved = with_head_classes(edits, classes)
    assert resolved[0].heads == HeadSelection("list", heads=((0, 3), (4, 1)))
    assert resolved[1].heads == HeadSelection("list", heads=((4, 2),)) and resolved[2] is edits[2]
    assert class_selections(resolved) == []
    assert edited_heads(resolved, 6, 12) == {(0, 3), (4, 1), (4, 2)}
    # A class the untouched run gave no head edits nothing, and its params read back.
    empty = with_head_classes(edits, {})
    assert empty[0].heads.resolve(6, 12) == frozenset()
    assert parse_interventions([edit.to_config() for edit in empty], "x") == empty


def test_a_random_selection_is_the_matched_control_of_a_class():
    classes = {(layer, head): "diffuse" for layer in (0, 4) for head in range(12)}
    classes.update({(0, 1): "sink", (0, 5): "sink", (4, 9): "sink", (4, 2): "sink?"})
    chosen = {}
    for heads in ("random:sink", "random:sink:0", "random:sink:1"):
        edit = parse_interventions([{"edit": "mask_keys", "heads": heads, "key_frames": [0]}], "x")[0]
        assert class_selections([edit]) == ["sink"]
        chosen[heads] = edit.heads.resolve(6, 12, classes)
        # as many heads in each layer as the class has there, none of the class
        assert sorted(layer for layer, _ in chosen[heads]) == [0, 0, 4]
        assert not {key for key in chosen[heads] if classes[key] == "sink"}
        assert edit.heads.to_config() == heads.removesuffix(":0")
        assert with_head_classes([edit], classes)[0].heads == HeadSelection("list", heads=tuple(sorted(chosen[heads])))
    assert chosen["random:sink"] == chosen["random:sink:0"] != chosen["random:sink:1"]
    with pytest.raises(ConfigError, match=r"'random:sink:x' is not random:<head class>"):
        parse_interventions([{"edit": "mask_keys", "heads": "random:sink:x", "key_frames": [0]}], "x")


def test_head_classes_are_the_untouched_runs_head_diagnostics(tmp_path):
    from synthetic import synthetic_rows

    from sinkscope.pipeline.headclasses import head_classes_job
    from sinkscope.stats.summaries import head_class_grid, head_diagnostics
    from sinkscope.tables import SCHEMAS, write_table

    rows = synthetic_rows(blocks=(3, 3, 3), heads=3, layers=(0, 4), seeds=(0, 1), checkpoint="demo")
    sink = (rows["layer"] == 4) & (rows["head"] == 1)
    rows.loc[sink, "prob_mass"] = (rows.loc[sink, "key_frame"] == 0).astype(float)  # L5H2 looks only at frame 0
    diagnostics = head_diagnostics(rows)
    table = tmp_path / "head_diagnostics.parquet"
    write_table(diagnostics, table, SCHEMAS["head_diagnostics"])
    output = tmp_path / "interventions" / "demo" / "head_classes.json"
    head_classes_job(diagnostics=table, output=output)
    classes = read_head_classes(output)
    grid = head_class_grid(diagnostics)  # what head_classes.csv and the summary page show
    assert classes == {
        (int(layer[1:]) - 1, int(head[1:]) - 1): label for layer, row in grid.iterrows() for head, label in row.items()
    }
    assert classes[(4, 1)] == "sink" and len(classes) == 6


def test_a_head_class_file_round_trips_and_a_damaged_one_is_named(tmp_path):
    classes = {(0, 0): "sink", (4, 9): "local?", (29, 11): "diffuse"}
    file = tmp_path / "head_classes.json"
    write_head_classes(file, classes, source="demo", call=("denoise", 3))
    assert read_head_classes(file) == classes
    assert '"L5H10": "local?"' in file.read_text()
    file.write_text('{"format": "sinkscope.head_classes/1", "classes": {"L0H1": "sink"}}')
    with pytest.raises(DamagedFileError, match="names 'L0H1', not a head"):
        read_head_classes(file)
    file.write_text("{")
    with pytest.raises(DamagedFileError, match="is not a head-class file"):
        read_head_classes(file)


# -- the names other modules hold -------------------------------------------------------------------------


def test_the_torch_free_name_lists_equal_their_sources():
    from sinkscope.model.quantize import CACHE_FORMATS, TENSORS
    from sinkscope.stats.summaries import HEAD_LABELS

    assert CACHE_FORMAT_NAMES == tuple(CACHE_FORMATS) and CACHE_TENSORS == TENSORS
    assert HEAD_CLASS_LABELS == HEAD_LABELS
    edit = load_schema()["$defs"]["generation"]["properties"]["interventions"]["items"]["properties"]
    assert tuple(edit["format"]["enum"]) == CACHE_FORMAT_NAMES and tuple(edit["tensors"]["enum"]) == CACHE_TENSORS
    assert edit["edit"]["enum"] == ["mask_keys", "logit_bias", "quantize_cache", "replace_frames"]


@pytest.mark.slow
@pytest.mark.workflow
def test_the_workflow_plans_the_head_classes_before_the_class_selecting_extractions(workflow):
    config = {
        **copy.deepcopy(BASE),
        "variants": {
            "no_sink": {"interventions": [{"edit": "mask_keys", "heads": "class:sink", "key_frames": [0]}]},
            "kv_int8": {"interventions": [{"edit": "quantize_cache", "format": "int8"}]},
        },
    }
    workflow.write_config(config)
    result = workflow.run("--dry-run", "--printshellcmds")
    jobs = [job for job in (result.stdout + result.stderr).split("\nrule ")[1:]]
    classes = [job for job in jobs if job.startswith("intervention_head_classes:")]
    assert len(classes) == 1 and "input: results/tables/checkpoints/demo/head_diagnostics.parquet" in classes[0]
    waiting = {
        line.split("output: ")[1].split(" ")[0]
        for job in jobs
        if job.startswith("extract_attention:") and "results/interventions/demo/head_classes.json" in job
        for line in job.splitlines()
        if "output: " in line
    }
    assert waiting == {f"results/extract/demo@no_sink/drift/seed0/layers{layer}" for layer in (0, 4)}
