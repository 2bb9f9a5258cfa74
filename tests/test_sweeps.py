"""sweeps: an edit template with one axis written each, expanded into the variants a user
would write by hand (equal rule params, equal paths), its one-line refusals, the names its
variants carry, and the atlas: selections of the pruning curve with their head orders."""

from __future__ import annotations

import copy
import json

import pytest

from sinkscope.errors import ConfigError, DamagedFileError, SinkscopeError
from sinkscope.interventions import (
    HEAD_ORDERS,
    HeadSelection,
    atlas_selections,
    edited_heads,
    parse_interventions,
    with_head_orders,
)
from sinkscope.naming import head_label
from sinkscope.pipeline.study import Study, load_study
from sinkscope.sweeps import (
    VARIANT_NAME,
    expand_sweeps,
    parse_sweeps,
    pruning_grid,
    read_head_orders,
    sweep_item,
    write_head_orders,
)

BASE = {
    "checkpoints": {"demo": {"model": "demo", "format": "demo"}},
    "prompts": {"drift": "a ball drifting left to right"},
    "seeds": [0, 1],
    "layers": [0, 4],
    "generation": {"num_frames": 9},
}
LAYERS, HEADS = 6, 12  # the demo model
EVERY_HEAD = [(layer, head) for layer in range(LAYERS) for head in range(HEADS)]

SWEEPS = {
    "sink_per_head": {"interventions": [{"edit": "mask_keys", "heads": "each", "key_frames": "sink"}]},
    "cache_per_frame": {"interventions": [{"edit": "mask_keys", "heads": "all", "key_frames": "each"}]},
    "per_layer": {
        "interventions": [
            {"edit": "quantize_cache", "format": "int8"},
            {"edit": "logit_bias", "heads": "each:layer", "key_frames": [0], "bias": -2},
        ]
    },
}


def hand_written() -> dict[str, dict]:
    """The variants of ``SWEEPS`` written out by hand, in spellings of their own."""
    variants = {}
    for layer, head in EVERY_HEAD:
        variants[f"sink_per_head/{head_label(layer, head)}"] = {
            "interventions": [{"edit": "mask_keys", "heads": head_label(layer, head), "key_frames": "sink"}]
        }
    for frame in range(6):  # 9 frames in blocks of 3: frames 0-5 are cached for a later block
        variants[f"cache_per_frame/f{frame}"] = {
            "interventions": [{"edit": "mask_keys", "heads": "all", "key_frames": frame}]
        }
    for layer in range(LAYERS):
        variants[f"per_layer/L{layer + 1}"] = {
            "interventions": [
                {"edit": "quantize_cache", "format": "int8", "tensors": "both"},
                {"edit": "logit_bias", "heads": [f"L{layer + 1}", f"L{layer + 1}H3"], "key_frames": [0], "bias": -2.0},
            ]
        }
    return variants


def expanded(sweeps: dict, **study) -> tuple[Study, dict[str, dict]]:
    """The study of ``sweeps`` (checked as load_study checks it) and its swept variants."""
    checked = load_study({**copy.deepcopy(BASE), **study, "sweeps": sweeps}, check_this_machine=False)
    options = checked.options["demo"]
    expansion = expand_sweeps(
        parse_sweeps(checked.config["sweeps"], checked.variants),
        num_layers=LAYERS,
        num_heads=HEADS,
        block_sizes=options.block_sizes(),
        sink_frames=options.sink_frames,
    )
    assert expansion.variants == checked.swept("demo")  # the study's own expansion
    return checked, expansion.variants


def by_hand(variants: dict[str, dict], **study) -> Study:
    """The study with ``variants`` written by hand (``<sweep>/<item>`` names)."""
    return load_study({**copy.deepcopy(BASE), **study, "variants": copy.deepcopy(variants)}, check_this_machine=False)


# -- expansion ---------------------------------------------------------------------------------------


def test_each_over_heads_layers_and_frames_gives_the_variants_written_by_hand():
    swept_study, swept = expanded(SWEEPS)
    hand_study = by_hand(hand_written())
    hand = {v: hand_study.config["variants"][v] for v in hand_written()}  # as the config check normalizes them
    assert list(swept) == list(hand)
    for name in hand:  # the entries are canonical: each is its hand-written spelling parsed and written back
        assert swept[name]["interventions"] == [
            edit.to_config() for edit in parse_interventions(hand[name]["interventions"], name)
        ]
    assert swept_study.variants == hand_study.variants == ["default"]
    assert swept_study.variants_of("demo") == hand_study.variants_of("demo") == ["default", *hand]
    assert list(swept_study.runs) == list(hand_study.runs)
    for source in hand_study.runs:  # same params and same outputs: nothing reruns between the forms
        groups = hand_study.run_groups(source)
        assert swept_study.run_groups(source) == groups
        for group in groups:
            group = "_".join(map(str, group))
            assert swept_study.extract_params(source, group) == hand_study.extract_params(source, group)
        assert swept_study.extract_dirs(source) == hand_study.extract_dirs(source)
    assert swept_study.effects_params("demo") == hand_study.effects_params("demo")
    assert swept_study.extraction_jobs == hand_study.extraction_jobs
    for job in hand_study.extraction_jobs:
        assert swept_study.job_params(job) == hand_study.job_params(job)
    assert swept_study.all_targets() == hand_study.all_targets()


def test_over_narrows_each_to_a_list_a_layer_the_sink_or_listed_frames():
    sweeps = {
        "listed": {
            "interventions": [{"edit": "mask_keys", "heads": "each", "key_frames": "cached"}],
            "over": ["L5H10", "L1H1", "L2"],
        },
        "layer5": {"interventions": [{"edit": "mask_keys", "heads": "each", "key_frames": [0]}], "over": "L5"},
        "two_layers": {
            "interventions": [{"edit": "mask_keys", "heads": "each:layer", "key_frames": [0]}],
            "over": ["L2", "L6"],
        },
        "sink_frames": {
            "interventions": [{"edit": "replace_frames", "key_frames": "each", "source": "noise"}],
            "over": "sink",
        },
        "some_frames": {
            "interventions": [{"edit": "mask_keys", "heads": ["L1H1"], "key_frames": "each"}],
            "over": [4, "1"],
        },
    }
    _, swept = expanded(
        sweeps, generation={"num_frames": 12, "cache_policy": "sink", "sink_frames": 3, "local_attn_frames": 9}
    )
    names = list(swept)
    assert names[:14] == ["listed/L1H1"] + [f"listed/L2H{h}" for h in range(1, 13)] + ["listed/L5H10"]
    assert [n for n in names if n.startswith("layer5/")] == [f"layer5/L5H{h}" for h in range(1, 13)]
    assert [n for n in names if n.startswith("two_layers/")] == ["two_layers/L2", "two_layers/L6"]
    assert [n for n in names if n.startswith("sink_frames/")] == ["sink_frames/f0", "sink_frames/f1", "sink_frames/f2"]
    assert swept["sink_frames/f1"]["interventions"] == [
        {"edit": "replace_frames", "key_frames": [1], "source": "noise"}
    ]
    assert [n for n in names if n.startswith("some_frames/")] == ["some_frames/f1", "some_frames/f4"]
    assert swept["two_layers/L6"]["interventions"][0]["heads"] == "L6"


def test_without_a_sink_policy_the_sink_is_frame_0():
    _, swept = expanded(
        {"s": {"interventions": [{"edit": "mask_keys", "heads": "all", "key_frames": "each"}], "over": "sink"}}
    )
    assert list(swept) == ["s/f0"]


def test_a_class_sweep_waits_for_the_untouched_runs_classes_and_then_runs_over_them():
    sweeps = parse_sweeps(
        {
            "sink_heads": {
                "interventions": [{"edit": "mask_keys", "heads": "each", "key_frames": "sink"}],
                "over": "class:sink",
            },
            "prune": {
                "interventions": [{"edit": "mask_keys", "heads": "each", "key_frames": "cached"}],
                "over": "atlas:sink_heads",
                "k": [1, 3],
            },
            "frames": {"interventions": [{"edit": "mask_keys", "heads": "all", "key_frames": "each"}]},
        }
    )
    assert sweeps["sink_heads"].needs_classes and not sweeps["frames"].needs_classes
    shape = {"num_layers": LAYERS, "num_heads": HEADS, "block_sizes": [3, 3, 3]}
    before = expand_sweeps(sweeps, **shape)
    assert before.waiting == ["sink_heads", "prune"] and list(before.variants) == [f"frames/f{f}" for f in range(6)]
    assert before.counts == {"sink_heads": LAYERS * HEADS, "prune": 6, "frames": 6}  # the most it can be
    classes = {head: ("sink" if head in ((0, 3), (4, 9), (1, 0)) else "local") for head in EVERY_HEAD}
    after = expand_sweeps(sweeps, **shape, head_classes=classes)
    assert after.waiting == []
    assert [n for n in after.variants if n.startswith("sink_heads/")] == [
        "sink_heads/L1H4",
        "sink_heads/L2H1",
        "sink_heads/L5H10",
    ]
    prune = {n: v for n, v in after.variants.items() if n.startswith("prune/")}
    assert list(prune) == ["prune/drift_k1", "prune/random_k1", "prune/frame0_mass_k1", "prune/all_k3"]
    # Every head of a class atlas: the plan does not know them, the atlas's first order does.
    assert prune["prune/all_k3"]["interventions"][0]["heads"] == "atlas:sink_heads:drift:3"


def test_the_pruning_curve_masks_the_first_k_heads_of_each_order_and_every_head_once():
    _, swept = expanded(
        {
            "sink_per_head": SWEEPS["sink_per_head"],
            "prune": {
                "interventions": [{"edit": "mask_keys", "heads": "each", "key_frames": "cached"}],
                "over": "atlas:sink_per_head",
            },
        }
    )
    prune = {n.split("/")[1]: v["interventions"][0] for n, v in swept.items() if n.startswith("prune/")}
    grid = pruning_grid(LAYERS * HEADS)
    assert grid == (5, 9, 18, 27, 36, 45, 54, 63, 72)
    assert list(prune) == [f"{order}_k{k}" for k in grid[:-1] for order in HEAD_ORDERS] + ["all_k72"]
    assert prune["random_k27"] == {
        "edit": "mask_keys",
        "heads": "atlas:sink_per_head:random:27",
        "key_frames": "cached",
    }
    assert prune["all_k72"]["heads"] == "all"  # the atlas's own heads: the same run as masking every head


def test_pruning_grid_is_finer_where_few_heads_are_masked():
    assert pruning_grid(360) == (23, 45, 90, 135, 180, 225, 270, 315, 360)
    assert pruning_grid(3) == (1, 2, 3) and pruning_grid(1) == (1,) and pruning_grid(0) == ()
    for count in range(1, 200):
        grid = pruning_grid(count)
        assert grid[-1] == count and list(grid) == sorted(set(grid)) and grid[0] >= 1


# -- names -----------------------------------------------------------------------------------------


def test_every_swept_name_says_its_sweep_item_and_axis():
    _, swept = expanded(
        {
            **SWEEPS,
            "prune": {
                "interventions": [{"edit": "mask_keys", "heads": "each", "key_frames": "cached"}],
                "over": "atlas:sink_per_head",
                "k": [4, 72],
            },
        }
    )
    for name in swept:
        assert VARIANT_NAME.match(name), name
        item = sweep_item(name)
        assert item is not None and f"{item.sweep}/{item.item}" == name
    assert sweep_item("sink_per_head/L5H10").axis == "head"
    assert (sweep_item("sink_per_head/L5H10").layer, sweep_item("sink_per_head/L5H10").head) == (4, 9)
    assert (sweep_item("per_layer/L6").axis, sweep_item("per_layer/L6").layer, sweep_item("per_layer/L6").head) == (
        "layer",
        5,
        -1,
    )
    assert (sweep_item("cache_per_frame/f5").axis, sweep_item("cache_per_frame/f5").frame) == ("frame", 5)
    ranked = sweep_item("prune/frame0_mass_k4")
    assert (ranked.axis, ranked.order, ranked.count) == ("ranked", "frame0_mass", 4)
    assert sweep_item("prune/all_k72").order == "all"
    for other in ("default", "no_sink", "x/L0H1", "x/f", "x/drift_k0", "x/best_k3"):
        assert sweep_item(other) is None


# -- refusals --------------------------------------------------------------------------------------


def _refusal(sweeps: dict, variants: dict | None = None) -> str:
    with pytest.raises(ConfigError) as error:
        parse_sweeps(sweeps, list(variants or ()))
    message = str(error.value)
    assert "\n" not in message, message
    return message


def _expansion_refusal(sweeps: dict, frames: int = 9) -> str:
    with pytest.raises(ConfigError) as error:
        expand_sweeps(parse_sweeps(sweeps), num_layers=LAYERS, num_heads=HEADS, block_sizes=[3] * (frames // 3))
    message = str(error.value)
    assert "\n" not in message, message
    return message


MASK = {"edit": "mask_keys", "heads": "each", "key_frames": "sink"}


@pytest.mark.parametrize(
    ("sweep", "words"),
    [
        ({"interventions": [{"edit": "mask_keys", "heads": "all", "key_frames": "sink"}]}, "no value is written each"),
        (
            {"interventions": [{"edit": "mask_keys", "heads": "each", "key_frames": "each"}]},
            "each is written twice ([0].heads and [0].key_frames)",
        ),
        (
            {"interventions": [MASK, {"edit": "logit_bias", "heads": "each", "key_frames": [0], "bias": 1}]},
            "each is written twice ([0].heads and [1].heads)",
        ),
        ({"interventions": [{"edit": "mask_keys", "heads": ["each"], "key_frames": "sink"}]}, "alone, not in a list"),
        ({"interventions": [{"edit": "mask_keys", "heads": "eachh", "key_frames": "sink"}]}, "did you mean 'each'?"),
        (
            {"interventions": [{"edit": "mask_keys", "heads": "all", "key_frames": "each:layer"}]},
            "key_frames: 'each:layer' is not 'each'",
        ),
        ({"interventions": [{"edit": "quantize_cache", "format": "each"}]}, "over heads or key_frames only"),
        ({"interventions": [{"edit": "quantize_cache", "format": "int8", "heads": "each"}]}, "takes no heads"),
        ({"interventions": []}, "is not a list of edits"),
        ({"interventions": [MASK], "ovr": "all"}, "unknown key 'ovr' (did you mean 'over'?)"),
        ({"interventions": [MASK], "cache_policy": "sink"}, "set other keys in generation:"),
        ({"interventions": [MASK], "over": []}, "config key sweeps.s.over: [] names nothing each could run over"),
        ({"interventions": [MASK], "over": "L0H1"}, "labels are 1-based"),
        ({"interventions": [MASK], "over": "class:sinks"}, "did you mean 'sink'?"),
        ({"interventions": [MASK], "k": [3]}, "config key sweeps.s.k: [3]: k (head counts) belongs"),
        (
            {"interventions": [{"edit": "mask_keys", "heads": "each:layer", "key_frames": [0]}], "over": "L1H1"},
            "a sweep over layers runs over all, or layers",
        ),
        (
            {"interventions": [{"edit": "mask_keys", "heads": "all", "key_frames": "each"}], "over": None},
            "None names nothing",
        ),
        (
            {"interventions": [{"edit": "mask_keys", "heads": "all", "key_frames": "each"}], "over": "sinks"},
            "did you mean 'sink'?",
        ),
        (
            {"interventions": [{"edit": "mask_keys", "heads": "each:layer", "key_frames": [0]}], "over": "atlas:x"},
            "takes heads: each",
        ),
        ({"interventions": [MASK], "over": "atlas:x", "k": [0]}, "config key sweeps.s.k: 0 is not a head count"),
    ],
)
def test_a_bad_sweep_is_refused_in_one_line_naming_its_key(sweep, words):
    message = _refusal({"s": sweep})
    assert "config key sweeps.s" in message and words in message, message


def test_names_clashing_with_variants_and_atlases_that_are_not_head_sweeps_are_refused():
    assert "'no_sink' is the name of a variant" in _refusal({"no_sink": {"interventions": [MASK]}}, {"no_sink": {}})
    assert "'default' is the name of a variant" in _refusal({"default": {"interventions": [MASK]}})
    message = _refusal({"s": {"interventions": [MASK]}}, {"s/L1H1": {}})
    assert "config key variants.s/L1H1: sweep 's' makes the variants s/<item>" in message
    assert "name 'a/b/c' is not" in _refusal({}, {"a/b/c": {}})
    prune = {"interventions": [MASK], "over": "atlas:frames"}
    message = _refusal({"p": prune})
    assert "config key sweeps.p.over: atlas:frames names no sweep" in message and "the study has none" in message
    frames = {"interventions": [{"edit": "mask_keys", "heads": "all", "key_frames": "each"}]}
    message = _refusal({"frames": frames, "heads": {"interventions": [MASK]}, "p": prune})
    assert "atlas:frames names a sweep over frames; it names a sweep of heads: each (heads)" in message
    classy = {"interventions": [MASK], "over": "class:sink"}
    message = _refusal({"c": classy, "p": {"interventions": [MASK], "over": "atlas:c"}})
    assert "config key sweeps.p.k: auto needs the atlas's head count" in message and "list the counts" in message
    assert "sweeps.bad name" in _refusal({"bad name": {"interventions": [MASK]}})


def test_an_over_the_model_or_the_video_lacks_is_refused_before_any_run():
    assert "sweeps.s.over: L7H1 is not a head of the model (6 layers, 12 heads)" in _expansion_refusal(
        {"s": {"interventions": [MASK], "over": ["L7H1"]}}
    )
    assert "sweeps.s.over: L9 is not a layer" in _expansion_refusal(
        {"s": {"interventions": [{"edit": "mask_keys", "heads": "each:layer", "key_frames": [0]}], "over": "L9"}}
    )
    frames = {"edit": "mask_keys", "heads": "all", "key_frames": "each"}
    assert "frame 6 is in the last block (frames 6-8), which no later block sees" in _expansion_refusal(
        {"s": {"interventions": [frames], "over": [2, 6]}}
    )
    assert "frame 12 is past the video's last frame 8" in _expansion_refusal(
        {"s": {"interventions": [frames], "over": [12]}}
    )
    prune = {"interventions": [MASK], "over": "atlas:a", "k": [4, 20]}
    message = _expansion_refusal({"a": {"interventions": [MASK], "over": "L1"}, "p": prune})
    assert "config key sweeps.p.k: 20 heads: atlas 'a' runs over 12 heads (L1)" in message


def test_a_variants_atlas_selection_of_more_heads_than_its_sweep_runs_over_is_refused_at_the_check():
    def study(count: int):
        heads = {"edit": "mask_keys", "heads": f"atlas:s:drift:{count}", "key_frames": "sink"}
        config = {
            **copy.deepcopy(BASE),
            "sweeps": {"s": {"interventions": [MASK], "over": "L1"}},
            "variants": {"v": {"interventions": [heads]}},
        }
        return load_study(config, check_this_machine=False)

    assert "v" in study(HEADS).config["variants"]
    with pytest.raises(ConfigError) as refused:
        study(HEADS + 1)
    assert (
        f"config key variants.v.interventions[0].heads: 'atlas:s:drift:{HEADS + 1}' takes {HEADS + 1} heads; "
        f"atlas 's' runs over {HEADS} heads" in str(refused.value)
    )


def test_the_schema_takes_sweeps_and_runs_per_job_and_coerces_them():
    checked = load_study(
        {
            **copy.deepcopy(BASE),
            "runs_per_job": "4",
            "sweeps": {
                "s": {"interventions": [MASK]},
                "f": {"interventions": [{"edit": "mask_keys", "heads": "all", "key_frames": "each"}], "over": ["3"]},
                "p": {"interventions": [MASK], "over": "atlas:s", "k": ["2", 5]},
            },
        },
        check_this_machine=False,
    )
    config = checked.config
    assert config["runs_per_job"] == 4
    assert config["sweeps"]["s"]["over"] == "all" and config["sweeps"]["f"]["over"] == [3]
    assert config["sweeps"]["p"]["k"] == [2, 5] and config["sweeps"]["s"]["k"] == "auto"
    assert load_study(copy.deepcopy(BASE), check_this_machine=False).config["runs_per_job"] == "auto"
    with pytest.raises(ConfigError, match="unknown config key 'ovr' in sweeps.s"):
        load_study({**copy.deepcopy(BASE), "sweeps": {"s": {"interventions": [MASK], "ovr": 1}}})
    with pytest.raises(ConfigError, match="runs_per_job"):
        load_study({**copy.deepcopy(BASE), "runs_per_job": 0})


# -- atlas: selections and head orders ----------------------------------------------------------------

ORDERS = {
    "drift": [(0, 1), (4, 9), (2, 2), (5, 0)],
    "random": [(2, 2), (5, 0), (0, 1), (4, 9)],
    "frame0_mass": [(5, 0), (0, 1), (4, 9), (2, 2)],
}


def test_an_atlas_selection_is_the_first_k_heads_of_its_order():
    edits = parse_interventions(
        [
            {"edit": "mask_keys", "heads": " atlas:sink_per_head:random:2 ", "key_frames": "cached"},
            {"edit": "quantize_cache", "format": "int8"},
        ],
        "x",
    )
    selection = edits[0].heads
    assert selection == HeadSelection("atlas", atlas="sink_per_head", order="random", count=2)
    assert selection.by_atlas and not selection.by_class and selection.problems(6, 12) == []
    assert selection.to_config() == "atlas:sink_per_head:random:2"
    assert atlas_selections(edits) == ["sink_per_head"]
    with pytest.raises(SinkscopeError, match="need the head orders of atlas 'sink_per_head'"):
        selection.resolve(6, 12)
    orders = {"sink_per_head": ORDERS}
    assert selection.resolve(6, 12, head_orders=orders) == {(2, 2), (5, 0)}
    resolved = with_head_orders(edits, orders)
    assert resolved[0].heads == HeadSelection("list", heads=((2, 2), (5, 0))) and resolved[1] == edits[1]
    assert edited_heads(edits, 6, 12, head_orders=orders) == {(2, 2), (5, 0)}
    too_many = parse_interventions(
        [{"edit": "mask_keys", "heads": "atlas:sink_per_head:drift:5", "key_frames": [0]}], "x"
    )
    with pytest.raises(SinkscopeError, match="orders 4 heads, not 5"):
        with_head_orders(too_many, orders)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("atlas:s:drift", "is not atlas:<sweep>:<order>:<k>"),
        ("atlas:s:drift:3:1", "is not atlas:<sweep>:<order>:<k>"),
        ("atlas:s:drfit:3", "did you mean 'drift'?"),
        ("atlas:s:drift:0", "'0' is not a head count"),
        ("atlas:s x:drift:3", "'s x' is not a sweep name"),
    ],
)
def test_a_bad_atlas_selection_is_refused_naming_its_key(value, words):
    with pytest.raises(ConfigError) as error:
        parse_interventions([{"edit": "mask_keys", "heads": value, "key_frames": [0]}], "variants.v.interventions")
    assert "config key variants.v.interventions[0].heads" in str(error.value) and words in str(error.value)


def test_head_orders_are_written_and_read_back_and_a_damaged_file_names_itself(tmp_path):
    file = tmp_path / "head_orders.json"
    write_head_orders(file, ORDERS, checkpoint="demo", sweep="sink_per_head", runs=3)
    data = json.loads(file.read_text())
    assert data["orders"]["drift"] == ["L1H2", "L5H10", "L3H3", "L6H1"] and data["runs"] == 3
    assert read_head_orders(file) == {"sink_per_head": ORDERS}
    with pytest.raises(SinkscopeError, match="lack random"):
        write_head_orders(file, {"drift": ORDERS["drift"]}, checkpoint="demo", sweep="s", runs=1)
    with pytest.raises(SinkscopeError, match="no head orders"):
        read_head_orders(tmp_path / "missing.json")
    for change, words in [
        (lambda d: d["orders"]["random"].pop(), "orders different heads"),
        (lambda d: d["orders"]["drift"].append("L1H2"), "names a head twice"),
        (lambda d: d["orders"].__setitem__("drift", ["L0H1"]), "names 'L0H1', not a head"),
        (lambda d: d["orders"].pop("frame0_mass"), "has no 'frame0_mass' order"),
        (lambda d: d.__setitem__("format", "other"), "is not a head-orders file"),
    ]:
        damaged = copy.deepcopy(data)
        change(damaged)
        file.write_text(json.dumps(damaged))
        with pytest.raises(DamagedFileError, match=words) as error:
            read_head_orders(file)
        assert str(file) in str(error.value)
    file.write_text("{")
    with pytest.raises(DamagedFileError, match="is not a head-orders file"):
        read_head_orders(file)


def test_a_swept_runs_refusal_from_the_variant_check_names_the_sweep():
    """What the variant check refuses in a swept variant (an edit the run cannot make) is
    said of the sweep the user wrote, the run named at the end, once a key."""
    from sinkscope.options import OptionsError
    from sinkscope.pipeline.config import generation_options
    from sinkscope.sweeps import sweep_message

    sweeps = {"noise": {"interventions": [{"edit": "replace_frames", "key_frames": "each", "source": 2}]}}
    with pytest.raises(ConfigError) as refused:
        load_study({**copy.deepcopy(BASE), "sweeps": sweeps}, check_this_machine=False)
    assert refused.value.problems == [
        "config key sweeps.noise.interventions[0].source: frame 2 must be earlier than every frame it replaces "
        "(key_frames [0]) (run noise/f0, and 2 more)"
    ]
    swept = expand_sweeps(parse_sweeps(sweeps), num_layers=LAYERS, num_heads=HEADS, block_sizes=[3, 3, 3]).variants
    config = load_study(BASE, check_this_machine=False).config | {"variants": swept}
    with pytest.raises(OptionsError) as error:
        generation_options(config, "noise/f0", "demo")
    message = sweep_message(str(error.value), list(sweeps))
    assert message.startswith("config key sweeps.noise.interventions[0].source: frame 2 must be earlier")
    assert message.endswith("(run noise/f0)")
    assert generation_options(config, "noise/f3", "demo").interventions[0].key_frames.frames == (3,)
    other = "config key variants.mine/L1H1.interventions[0].heads: L9H1 is not a head"
    assert sweep_message(other, ["noise"]) == other


def test_a_hand_written_atlas_selection_must_name_a_head_sweep():
    variants = {
        "mine": {"interventions": [{"edit": "mask_keys", "heads": "atlas:heads:random:3", "key_frames": [0]}]},
        "theirs": {"interventions": [{"edit": "mask_keys", "heads": "atlas:frames:drift:3", "key_frames": [0]}]},
        "broken": {"interventions": [{"edit": "mask_key"}]},  # the variant check's to refuse
    }
    sweeps = {"heads": {"interventions": [MASK]}, "frames": SWEEPS["cache_per_frame"]}
    with pytest.raises(ConfigError) as error:
        parse_sweeps(sweeps, variants)
    assert str(error.value) == (
        "invalid config: config key variants.theirs.interventions[0].heads: 'atlas:frames:drift:3' names no sweep "
        "of heads: each (heads)"
    )
    assert set(parse_sweeps(sweeps, {name: variants[name] for name in ("mine", "broken")})) == {"heads", "frames"}
