"""Prompt schedules and per-checkpoint generation in the config: checked at config time with
one line naming the key, and planned as the study's embedding files, rule params and
figure targets."""

from __future__ import annotations

import pytest

from sinkscope.errors import ConfigError
from sinkscope.pipeline.config import normalize_config
from sinkscope.pipeline.study import Study


def schedule(*starts, texts=None):
    texts = texts or [f"a ball, part {i}" for i in range(len(starts))]
    return [{"text": text, "start_frame": start} for text, start in zip(texts, starts)]


def test_a_schedule_is_planned_as_one_embedding_per_segment():
    config = normalize_config(
        {"prompts": {"circle": "a ball moving in a circle", "story": schedule(0, 9, 15)}, "layers": [0]}
    )
    study = Study(config)
    assert study.switches == {"story": [9, 15]}
    assert study.segment_starts("story") == [0, 9, 15] and study.segment_starts("circle") == [0]
    key = study.text_encoder("demo").key
    assert study.embeddings("demo", "circle") == [f"results/prompts/{key}/circle.safetensors"]
    assert study.embeddings("demo", "story") == [
        f"results/prompts/{key}/story/segment{i}.safetensors" for i in range(3)
    ]
    assert study.segment_text("story", 2) == "a ball, part 2"
    targets = study.all_targets()
    assert f"results/prompts/{key}/story/segment1.safetensors" in targets
    assert "results/figures/demo/prompt_switch.svg" in targets
    # Without a switch there is no prompt-switch figure.
    plain = Study(normalize_config({"layers": [0]}))
    assert not plain.switches and not any("prompt_switch" in t for t in plain.all_targets())


def test_a_schedule_of_one_segment_is_its_text():
    config = normalize_config({"prompts": {"one": schedule(0, texts=["a ball"])}})
    assert config["prompts"]["one"] == "a ball"


@pytest.mark.parametrize(
    "prompt, extra, message",
    [
        (schedule(3, 9), {}, "config key prompts.story[0].start_frame: 3 is not 0: the first segment starts the video"),
        (
            schedule(0, 9, 9),
            {},
            "config key prompts.story[2].start_frame: 9 does not come after the previous segment's start 9",
        ),
        (schedule(0, 21), {}, "config key prompts.story[1].start_frame: 21 is past the video's last frame 20"),
        (
            schedule(0, 4),
            {},
            "config key prompts.story[1].start_frame: 4 is not where a block starts (blocks start at frames 0, 3, 6",
        ),
        (
            schedule(0, 12),
            {"variants": {"first": {"independent_first_frame": True, "num_frames": 22}}},
            "config key prompts.story[1].start_frame: 12 is not where a block starts (blocks start at frames 0, 1, "
            "4, 7, 10, 13, ...) (variant 'first')",
        ),
        (schedule(0, 9, texts=["a ball", "  "]), {}, "config key prompts.story[1].text: the prompt is empty"),
        ([{"text": "a ball", "start": 0}], {}, "unknown config key 'start' in prompts.story[0]"),
        ([{"text": "a ball"}], {}, "'start_frame' is a required property"),
        ([], {}, "config key prompts.story: [] should be non-empty"),
        (
            schedule(0, 9),
            {"generation": {"cache_policy": "deep_sink", "num_frames": 30}},
            "config key generation.re_cache: true needs cache_policy 'global', 'window', 'sink' (the KV re-cache of "
            "LongLive), not 'deep_sink'; set re_cache: false to only switch the prompt (prompt 'story' switches at "
            "frame 9)",
        ),
        (
            schedule(0, 9),
            {"variants": {"ds": {"cache_policy": "ema_sink"}}},
            "config key variants.ds.re_cache: true needs",
        ),
    ],
)
def test_bad_schedules_name_the_key(prompt, extra, message):
    with pytest.raises(ConfigError) as error:
        normalize_config({"prompts": {"story": prompt}, **extra})
    assert message in str(error.value)


def test_re_cache_off_switches_under_any_policy_and_single_prompts_never_ask():
    normalize_config(
        {
            "prompts": {"story": schedule(0, 9)},
            "generation": {"cache_policy": "deep_sink", "re_cache": False, "num_frames": 30},
        }
    )
    normalize_config({"generation": {"cache_policy": "deep_sink", "num_frames": 30}})  # re_cache true, no switch


def test_recache_calls_count_in_the_memory_estimate():
    from sinkscope.model.config import get_model_config
    from sinkscope.options import GenerationOptions
    from sinkscope.pipeline.resources import estimate_job_memory

    config = get_model_config("wan2.1-t2v-1.3b")
    options = GenerationOptions.from_config({"num_frames": 120, "cache_policy": "sink"})
    plain = estimate_job_memory(config, options, "bfloat16", captured_layers=30)
    switching = estimate_job_memory(config, options, "bfloat16", captured_layers=30, switch_frames=[42, 81])
    assert options.largest_call_frames([42]) == 12 and options.calls([42, 81]) == options.num_calls + 2
    assert switching.activations == 4 * plain.activations  # a 12-frame re-cache call against blocks of 3


def test_checkpoints_bring_their_own_generation():
    """A frame-wise few-step checkpoint beside a chunk-wise one: each runs its own
    inference settings; variants apply on top of both."""
    framewise = {
        "frames_per_block": 1,
        "denoising_steps": [1000, 500],
        "first_block_denoising_steps": [1000, 750, 500, 250],
    }
    config = normalize_config(
        {
            "checkpoints": {
                "chunk": {"model": "demo", "format": "demo"},
                "frame": {"model": "demo", "format": "demo", "generation": framewise},
            },
            "variants": {"short": {"num_frames": 9}, "window": {"cache_policy": "window", "local_attn_frames": 6}},
            "layers": [0],
        }
    )
    study = Study(config)
    options = {source: study.options[source] for source in study.runs}
    assert options["chunk@short"].frames_per_block == 3 and options["chunk@short"].num_frames == 9
    assert options["frame@short"].frames_per_block == 1 and options["frame@short"].num_frames == 9
    assert options["frame@window"].first_block_denoising_steps == (1000, 750, 500, 250)
    assert options["frame@window"].local_attn_frames == 6 and options["frame@window"].num_calls == 5 + 20 * 3
    assert study.extract_params("frame@short", "0")["generation"]["frames_per_block"] == 1
    assert study.extract_params("chunk@short", "0")["generation"]["frames_per_block"] == 3


@pytest.mark.parametrize(
    "generation, message",
    [
        (
            {"num_frames": 20},
            "config key checkpoints.demo.generation.num_frames: 20 must be a multiple of frames_per_block = 3",
        ),
        (
            {"denoising_steps": [500, 1000]},
            "config key checkpoints.demo.generation.denoising_steps: [500, 1000] must decrease",
        ),
        (
            {"first_block_denoising_steps": [250, 500]},
            "checkpoints.demo.generation.first_block_denoising_steps: [250, 500] must decrease",
        ),
        ({"frames": 3}, "unknown config key 'frames' in checkpoints.demo.generation"),
    ],
)
def test_bad_checkpoint_generation_names_the_key(generation, message):
    with pytest.raises(ConfigError) as error:
        normalize_config({"checkpoints": {"demo": {"model": "demo", "format": "demo", "generation": generation}}})
    assert message in str(error.value)


def test_a_schedule_is_checked_against_each_checkpoints_blocks():
    config = {
        "checkpoints": {
            "chunk": {"model": "demo", "format": "demo"},
            "frame": {"model": "demo", "format": "demo", "generation": {"frames_per_block": 1}},
        },
        "prompts": {"story": schedule(0, 7)},
    }
    with pytest.raises(ConfigError) as error:
        normalize_config(config)
    assert str(error.value) == (
        "invalid config: config key prompts.story[1].start_frame: 7 is not where a block starts "
        "(blocks start at frames 0, 3, 6, 9, 12, 15, ...) (checkpoint 'chunk')"
    )
