"""Prompt schedules: the context switches at a block start; LongLive's KV re-cache rewrites
exactly the kept frames it should, with the keys/values of a fresh forward of the
recomputed frames under the new prompt; the rows carry the prompt segment and the
re-cache pass; the row checks count it; few-step schedules with a first block of its own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_model import TINY, tiny_model

from sinkscope.generation import loop
from sinkscope.generation.capture import FrameStatsCapture
from sinkscope.generation.common import NoiseStream
from sinkscope.generation.sampler import generate
from sinkscope.model import build_model
from sinkscope.options import GenerationOptions, OptionsError
from sinkscope.pipeline.integrity import check_layer_rows

FSL = TINY.frame_seq_length()


class CacheWatch:
    """Keeps the policy generate() builds, and snapshots of its cache before chosen calls."""

    def __init__(self, monkeypatch, *moments):
        self.policy = None
        self.moments = set(moments)
        self.snapshots = {}
        build = loop.policy_from_options

        def keep(*args, **kwargs):
            self.policy = build(*args, **kwargs)
            return self.policy

        monkeypatch.setattr(loop, "policy_from_options", keep)

    def begin_call(self, info):
        moment = (info.block, info.pass_, info.step)
        if moment in self.moments:
            store = self.policy.cache
            self.snapshots[moment] = {
                "frames": store.frames(0),
                "kv": [tuple(t.clone() for t in store.keys(layer)) for layer in range(store.num_layers)],
                "cross": store.cross[0][0].clone() if store.cross[0] is not None else None,
            }


def contexts(seed=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, n, TINY.text_dim, generator=g, dtype=torch.float64) for n in (5, 4)]


def reference_recache(model, latents, first, context, t, held, old_kv, protected):
    """LongLive's re-cache written out: one forward of frames [first, F) under ``context``
    at ``t``; in each layer the queries see every held frame, the held frames of the range
    (the protected sink excepted) with this forward's keys/values, the others with the
    keys/values the cache had. Returns each layer's keys/values of the held frames."""
    count = latents.shape[2]
    rewritten = [f for f in held if first <= f < first + count and f not in protected]
    expected = []
    originals = [block.self_attn.attend for block in model.blocks]

    def attend_for(layer):
        def attend(q, k, v, cache_policy=None, attn_mask=None, raw_k=None, kernels=None):
            keys, values = [], []
            for i, frame in enumerate(held):
                if frame in rewritten:
                    at = (frame - first) * FSL
                    keys.append(k[:, at : at + FSL])
                    values.append(v[:, at : at + FSL])
                else:
                    keys.append(old_kv[layer][0][:, i * FSL : (i + 1) * FSL])
                    values.append(old_kv[layer][1][:, i * FSL : (i + 1) * FSL])
            keys, values = torch.cat(keys, 1), torch.cat(values, 1)
            expected.append((keys, values))
            out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2))
            return out.transpose(1, 2).flatten(2)

        return attend

    try:
        for layer, block in enumerate(model.blocks):
            block.self_attn.attend = attend_for(layer)
        with torch.no_grad():
            model(latents, torch.full((1, count), t, dtype=torch.float64), context, start_frame=first)
    finally:
        for block, original in zip(model.blocks, originals):
            block.self_attn.attend = original
    return expected, rewritten


CASES = {
    # policy keys, frames, block size, switch frame -> frames rewritten, recomputed range start
    "global": ({}, 8, 2, 6, [0, 1, 2, 3, 4, 5], 0),
    "window": ({"cache_policy": "window", "local_attn_frames": 4}, 10, 2, 6, [2, 3, 4, 5], 2),
    # The sink (frames 0-1) keeps the first prompt's keys; frames 2-3 are recomputed as
    # queries only (evicted); 6-9 are rewritten.
    "sink": ({"cache_policy": "sink", "local_attn_frames": 6, "sink_frames": 2}, 14, 2, 10, [6, 7, 8, 9], 4),
    # A range from frame 0 (the cache not yet full) rewrites the sink too, as LongLive.
    "sink_from_0": (
        {"cache_policy": "sink", "local_attn_frames": 6, "sink_frames": 2},
        10,
        2,
        6,
        [0, 1, 2, 3, 4, 5],
        0,
    ),
    "sink_frame_blocks": (
        {"cache_policy": "sink", "local_attn_frames": 5, "sink_frames": 2, "frames_per_block": 1},
        9,
        1,
        7,
        [4, 5, 6],
        2,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_re_cache_rewrites_exactly_the_kept_frames_with_a_fresh_forward(case, monkeypatch):
    keys, frames, block, switch, rewritten, first = CASES[case]
    options = GenerationOptions.from_config({"num_frames": frames, "frames_per_block": block, **keys})
    model = tiny_model()
    a, b = contexts()
    switch_block = switch // block
    watch = CacheWatch(monkeypatch, (switch_block, "recache", 0), (switch_block, "denoise", 0))
    result = generate(model, [(0, a), (switch, b)], options=options, seed=0, observers=[watch])
    recache = [c for c in result.calls if c.pass_ == "recache"]
    assert [(c.block, c.start_frame, c.num_frames, c.segment) for c in recache] == [
        (switch_block, first, switch - first, 1)
    ]
    before, after = watch.snapshots[(switch_block, "recache", 0)], watch.snapshots[(switch_block, "denoise", 0)]
    held = before["frames"]
    assert after["frames"] == held  # no block bookkeeping: the same frames, in the same slots
    latents = result.latents[:, :, first:switch]
    protected = set(range(options.sink_frames)) if first > 0 else set()
    expected, rewritten_by_reference = reference_recache(model, latents, first, b, 0.0, held, before["kv"], protected)
    assert rewritten_by_reference == rewritten
    for layer in range(TINY.num_layers):
        got_k, got_v = after["kv"][layer]
        want_k, want_v = expected[layer]
        torch.testing.assert_close(got_k, want_k, rtol=0, atol=1e-10)
        torch.testing.assert_close(got_v, want_v, rtol=0, atol=1e-10)
        for i, frame in enumerate(held):  # what is not rewritten is untouched, bit for bit
            part = slice(i * FSL, (i + 1) * FSL)
            if frame not in rewritten:
                assert torch.equal(got_k[:, part], before["kv"][layer][0][:, part])
            elif layer > 0:  # layer 0's keys see no prompt yet (cross-attention comes after them)
                assert not torch.equal(got_k[:, part], before["kv"][layer][0][:, part])
    # The cross-attention K/V: dropped at the switch, the new prompt's from the re-cache on.
    assert before["cross"] is None
    torch.testing.assert_close(after["cross"], model.context_kv(b)[0][0], rtol=0, atol=0)


def test_without_re_cache_only_the_context_switches(monkeypatch):
    options = GenerationOptions.from_config({"num_frames": 8, "frames_per_block": 2, "re_cache": False})
    model = tiny_model()
    a, b = contexts()
    watch = CacheWatch(monkeypatch, (2, "denoise", 0), (2, "denoise", 1))
    with_switch = generate(model, [(0, a), (4, b)], options=options, seed=0, observers=[watch])
    assert [c.pass_ for c in with_switch.calls].count("recache") == 0
    assert [c.segment for c in with_switch.calls] == [0] * 10 + [1] * 10
    before, after = watch.snapshots[(2, "denoise", 0)], watch.snapshots[(2, "denoise", 1)]
    # At the switch block's first call the old frames' keys are those of the first prompt.
    single = generate(model, a, options=options, seed=0)
    torch.testing.assert_close(with_switch.latents[:, :, :4], single.latents[:, :, :4], rtol=0, atol=0)
    assert not torch.allclose(with_switch.latents[:, :, 4:], single.latents[:, :, 4:])
    for layer in range(TINY.num_layers):
        assert torch.equal(after["kv"][layer][0][:, : 4 * FSL], before["kv"][layer][0][:, : 4 * FSL])
    assert before["cross"] is None  # dropped at the switch; the switch block's first call computes the new one
    expected_cross = model.context_kv(b)[0][0]
    torch.testing.assert_close(after["cross"], expected_cross, rtol=0, atol=0)


@pytest.mark.slow
def test_rows_carry_the_segment_and_the_re_cache_pass():
    model = build_model("demo", seed=0)
    g = torch.Generator().manual_seed(1)
    schedule = [(0, torch.randn(1, 7, 64, generator=g)), (6, torch.randn(1, 5, 64, generator=g))]
    options = GenerationOptions.from_config(
        {"num_frames": 12, "cache_policy": "sink", "local_attn_frames": 9, "sink_frames": 3}
    )
    capture = FrameStatsCapture(model, [0], frame_seq_length=24, token_profiles="all")
    with capture:
        result = generate(model, schedule, options=options, seed=0, observers=[capture])
    tables = capture.layer_tables()[0]
    frames = tables["frames"]
    assert options.calls([6]) == len(result.calls) == 4 * 5 + 1
    check_layer_rows(frames, layer=0, calls=options.calls([6]), heads=12, where="test")
    with pytest.raises(Exception, match="holds 21 calls of layer 0, the generation makes 20"):
        check_layer_rows(frames, layer=0, calls=options.num_calls, heads=12, where="test")
    segments = frames.groupby("block")["prompt_segment"].agg(set)
    assert segments.to_dict() == {0: {0}, 1: {0}, 2: {1}, 3: {1}}
    recache = frames[frames["pass"] == "recache"]
    assert set(recache["block"]) == {2} and set(recache["step"]) == {0} and set(recache["timestep"]) == {0.0}
    assert sorted(set(recache["query_frame"])) == [0, 1, 2, 3, 4, 5]  # min(W, F) = 6 frames from 0
    assert sorted(set(recache["key_frame"])) == [0, 1, 2, 3, 4, 5]
    for kind in ("queries", "tokens"):
        part = tables[kind]
        assert set(part.loc[part["pass"] == "recache", "prompt_segment"]) == {1}
        assert set(part.loc[part["block"] < 2, "prompt_segment"]) == {0}
    # The same rows feed the prompt-switch figure.
    from sinkscope import plot

    rows = frames.assign(checkpoint="demo", variant="default", prompt_id="p", seed=0)
    fig = plot.plot_prompt_switch(rows)
    gids = {artist.get_gid() for ax in fig.axes for artist in ax.get_children()}
    assert "switch-p-1" in gids and "sink-default-p-1" in gids and "before-default-p-1" in gids


def test_a_single_prompt_keeps_segment_0_and_its_calls():
    options = GenerationOptions(num_frames=6)
    model = build_model("demo", seed=0)
    context = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(1))
    one = generate(model, context, options=options, seed=0)
    schedule = generate(model, [(0, context)], options=options, seed=0)
    assert torch.equal(one.latents, schedule.latents)
    assert {c.segment for c in one.calls} == {0} and len(one.calls) == options.num_calls == options.calls([])


@pytest.mark.parametrize(
    "keys, starts, message",
    [
        (
            {"cache_policy": "deep_sink", "local_attn_frames": 9, "sink_frames": 3},
            [0, 6],
            "re_cache: true needs cache_policy",
        ),
        ({}, [0, 4], "prompt switch at frame 4"),
        ({}, [3, 6], "starts at frame 0"),
        ({}, [0, 12], "prompt switch at frame 12"),
    ],
)
def test_schedules_generate_refuses(keys, starts, message):
    options = GenerationOptions.from_config({"num_frames": 12, **keys})
    model = build_model("demo", seed=0)
    context = torch.randn(1, 7, 64)
    with pytest.raises(OptionsError, match=message):
        generate(model, [(start, context) for start in starts], options=options, seed=0)


def test_re_cache_off_switches_under_any_policy():
    options = GenerationOptions.from_config(
        {"num_frames": 12, "cache_policy": "deep_sink", "local_attn_frames": 9, "sink_frames": 3, "re_cache": False}
    )
    model = build_model("demo", seed=0)
    context = torch.randn(1, 7, 64)
    result = generate(model, [(0, context), (6, 2 * context)], options=options, seed=0)
    assert len(result.calls) == options.calls([6]) == options.num_calls


@pytest.mark.slow
def test_few_step_blocks_with_a_first_block_of_their_own():
    """Causal Forcing++ frame-wise 2-step: blocks of one frame, 4 steps for block 0, then 2."""
    options = GenerationOptions.from_config(
        {
            "num_frames": 5,
            "frames_per_block": 1,
            "denoising_steps": [1000, 500],
            "first_block_denoising_steps": [1000, 750, 500, 250],
        }
    )
    model = build_model("demo", seed=0)
    result = generate(model, torch.randn(1, 7, 64), options=options, seed=0)
    calls = [(c.block, c.pass_, c.step, round(c.timestep, 2)) for c in result.calls]
    assert calls[:5] == [
        (0, "denoise", 0, 1000.0),
        (0, "denoise", 1, 937.5),
        (0, "denoise", 2, 833.33),
        (0, "denoise", 3, 625.0),
        (0, "cache", 4, 0.0),
    ]
    assert calls[5:8] == [(1, "denoise", 0, 1000.0), (1, "denoise", 1, 833.33), (1, "cache", 2, 0.0)]
    assert len(calls) == options.num_calls == 5 + 4 * 3
    # The noise: one stream, block 0's three re-noising draws before block 1's one.
    frame = (model.config.in_dim, model.config.latent_height, model.config.latent_width)
    stream = NoiseStream(0, 5, frame, renoise_frames=3 + 4)
    [stream.renoise(1) for _ in range(7)]
    with pytest.raises(ValueError, match="only 7 re-noising frames"):
        stream.renoise(1)
    same = GenerationOptions.from_config(
        {"num_frames": 5, "frames_per_block": 1, "first_block_denoising_steps": [1000, 750, 500, 250]}
    )
    assert same.first_block_denoising_steps is None and same == GenerationOptions(num_frames=5, frames_per_block=1)


@pytest.mark.workflow
def test_a_schedule_through_the_workflow(workflow):
    """Segment embeddings, the re-cache pass in the tables of the variant that re-caches,
    the segment column everywhere, and the prompt-switch figure."""
    import pandas as pd

    workflow.write_config(
        {
            "prompts": {
                "story": [
                    {"text": "a ball moving in a circle", "start_frame": 0},
                    {"text": "a ball bouncing up and down", "start_frame": 3},
                ]
            },
            "layers": [0],
            "generation": {"num_frames": 6},
            "capture": {"token_profiles": "none"},
            "variants": {"recache": {}, "switch": {"re_cache": False}},
        }
    )
    workflow.run()
    assert sorted(p.name for p in workflow.path("results/prompts").rglob("*.safetensors")) == [
        "segment0.safetensors",
        "segment1.safetensors",
    ]
    frame = pd.read_parquet(workflow.path("results/tables/frame_attention.parquet"))
    calls = frame.groupby(["variant", "block", "pass"], observed=True)["prompt_segment"].agg(set)
    assert calls.to_dict() == {
        ("recache", 0, "denoise"): {0},
        ("recache", 0, "cache"): {0},
        ("recache", 1, "recache"): {1},
        ("recache", 1, "denoise"): {1},
        ("recache", 1, "cache"): {1},
        ("switch", 0, "denoise"): {0},
        ("switch", 0, "cache"): {0},
        ("switch", 1, "denoise"): {1},
        ("switch", 1, "cache"): {1},
    }
    blocks = pd.read_parquet(workflow.path("results/tables/block_stats.parquet"))
    assert set(blocks.loc[blocks["block"] == 1, "prompt_segment"]) == {1}
    assert workflow.path("results/figures/demo/prompt_switch.svg").read_text().count('id="switch-story-1"') == 2
    # Only the switch variant's jobs rerun when its re_cache changes back.
    config = workflow.path("config.yaml")
    config.write_text(config.read_text().replace("re_cache: false", "re_cache: true"))
    assert workflow.planned_jobs()["extract_attention"] == 1
