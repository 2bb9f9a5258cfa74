"""Edits during generation (issue 35; ``sinkscope.model.generation_edits``): each edit against a float64
brute force where it applies, block 0 untouched, the identity edits bit for bit."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd
import pytest
import torch

from sinkscope.generation.capture import FrameStatsCapture
from sinkscope.generation.sampler import generate
from sinkscope.interventions import parse_interventions
from sinkscope.model import WanConfig, build_model
from sinkscope.model.generation_edits import GenerationEdits
from sinkscope.model.layout import AttentionLayout
from sinkscope.model.policies import generation_edits, new_policy, policy_from_options
from sinkscope.model.quantize import quantize_cache
from sinkscope.model.wan import apply_rope
from sinkscope.options import GenerationOptions

# The demo's kind, smaller: head_dim 16 (nvfp4's blocks), 3 layers of 4 heads, 6 tokens a frame.
SMALL = WanConfig(
    dim=64, ffn_dim=64, num_heads=4, num_layers=3, text_dim=16, text_len=8, freq_dim=16, latent_height=4, latent_width=6
)
FSL = SMALL.frame_seq_length()
GRID = (2, 3)  # the patch grid
LAYERS, HEADS = SMALL.num_layers, SMALL.num_heads
NO_SINK = [{"edit": "mask_keys", "heads": ["L1H1", "L3H4"], "key_frames": [0]}]


@lru_cache(maxsize=1)
def demo():
    return build_model(SMALL, seed=0)


def context():
    return torch.randn(1, 5, SMALL.text_dim, generator=torch.Generator().manual_seed(1))


class Recorder:
    """Keeps layer 0's q, k, layout and frame bias of every call (the capture's observer runs after it)."""

    def __init__(self, inner):
        self.inner, self.calls, self.info = inner, [], None

    def begin_call(self, info):
        self.info = info

    def __call__(self, q, k, v, layout, frame_bias=None):
        self.calls.append((self.info, q[0].transpose(0, 1).clone(), k[0].transpose(0, 1).clone(), layout, frame_bias))
        return self.inner(q, k, v, layout) if frame_bias is None else self.inner(q, k, v, layout, frame_bias=frame_bias)


def options(interventions=(), frames=6, **generation):
    """Two denoising steps a block: 3 calls (2 steps and the cache pass)."""
    return GenerationOptions.from_config(
        {"num_frames": frames, "denoising_steps": [1000, 500], "interventions": list(interventions), **generation}
    )


def run(interventions=(), *, frames=6, layers=(0, 2), record=False, **generation):
    model = demo()
    capture = FrameStatsCapture(model, layers, frame_seq_length=FSL, token_profiles="none")
    recorder = None
    with capture:
        observers = [capture]
        if record:
            attn = model.blocks[layers[0]].self_attn
            recorder = attn.observer = Recorder(attn.observer)
            observers.append(recorder)
        result = generate(
            model, context(), options=options(interventions, frames, **generation), seed=0, observers=observers
        )
    rows = {layer: tables["frames"] for layer, tables in capture.layer_tables(kinds=("frames",)).items()}
    return result.latents, rows, recorder


@lru_cache(maxsize=1)
def untouched():
    return run()


def biased_prob_mass(q, k, key_lengths, frame_bias, num_q):
    """prob_mass [H, query frames, key segments] of the softmax of q.k / sqrt(d) + bias, in float64."""
    q, k = q.double(), k.double()
    scores = torch.einsum("hqd,hkd->hqk", q, k) * q.shape[-1] ** -0.5
    lengths = torch.tensor(key_lengths)
    if frame_bias is not None:
        scores = scores + frame_bias.double().repeat_interleave(lengths, dim=1)[:, None, :]
    probs = torch.softmax(scores, dim=-1)
    segment = torch.repeat_interleave(torch.arange(len(key_lengths)), lengths)
    per_frame = torch.zeros(q.shape[0], q.shape[1], len(key_lengths), dtype=torch.float64).index_add_(2, segment, probs)
    return per_frame.unflatten(1, (num_q, -1)).mean(dim=2)


def rows_of(table, call):
    part = table[(table["block"] == call.block) & (table["pass"] == call.pass_) & (table["step"] == call.step)]
    return part.sort_values(["head", "query_frame", "key_frame"], kind="stable")


# -- attention edits ----------------------------------------------------------------------------


def test_masked_heads_give_masked_frames_zero_mass_after_block_0_and_block_0_is_untouched():
    base_latents, base_rows, _ = untouched()
    latents, rows, recorder = run(NO_SINK, record=True)
    assert torch.equal(latents[:, :, :3], base_latents[:, :, :3]) and not torch.equal(latents, base_latents)
    for layer, head in ((0, 0), (2, 3)):
        table = rows[layer]
        later = table[(table["block"] > 0) & (table["key_frame"] == 0)]
        assert len(later) and (later.loc[later["head"] == head, "prob_mass"] == 0).all()
        assert (later.loc[later["head"] != head, "prob_mass"] > 0).all()
        block0 = [t[t["block"] == 0].reset_index(drop=True) for t in (table, base_rows[layer])]
        pd.testing.assert_frame_equal(*block0)
    # The rows are the statistics of the masked softmax the model used (float64 brute force).
    for info, q, k, layout, bias in recorder.calls:
        assert (bias is None) == (info.block == 0)
        expected = biased_prob_mass(q, k, layout.key_lengths, bias, len(layout.query_frames))
        got = rows_of(rows[0], info)["prob_mass"].to_numpy()
        order = np.argsort(layout.key_frames, kind="stable")
        assert np.allclose(got, expected[:, :, order].flatten().numpy(), atol=1e-7, rtol=1e-5)


def test_a_logit_bias_is_a_biased_softmax_and_a_zero_bias_or_no_edit_is_the_untouched_video():
    base_latents, base_rows, _ = untouched()
    for identity in ([{"edit": "logit_bias", "heads": "all", "key_frames": [0], "bias": 0.0}], []):
        latents, rows, _ = run(identity)
        assert torch.equal(latents, base_latents)
        for layer in rows:
            pd.testing.assert_frame_equal(rows[layer], base_rows[layer])
    latents, rows, recorder = run(
        [{"edit": "logit_bias", "heads": "all", "key_frames": [0], "bias": -2.0}], record=True
    )
    assert torch.equal(latents[:, :, :3], base_latents[:, :, :3]) and not torch.equal(latents, base_latents)
    for info, q, k, layout, bias in recorder.calls:
        if info.block > 0:
            assert torch.equal(bias[:, np.asarray(layout.key_frames) == 0], torch.full((HEADS, 1), -2.0))
        expected = biased_prob_mass(q, k, layout.key_lengths, bias, len(layout.query_frames))
        order = np.argsort(layout.key_frames, kind="stable")
        assert np.allclose(
            rows_of(rows[0], info)["prob_mass"].to_numpy(),
            expected[:, :, order].flatten().numpy(),
            atol=1e-7,
            rtol=1e-5,
        )


def test_key_frames_sink_are_the_sink_policys_sink_frames():
    edits = [{"edit": "mask_keys", "heads": "L1", "key_frames": "sink"}]
    _, rows, _ = run(edits, frames=9, layers=(0,), cache_policy="sink", local_attn_frames=5, sink_frames=2)
    later = rows[0][rows[0]["block"] > 0]
    assert (later.loc[later["key_frame"] < 2, "prob_mass"] == 0).all()
    assert (later.loc[later["key_frame"] >= 2, "prob_mass"] > 0).all()
    assert set(later["key_frame"]) > {0, 1}


def _edits(spec, *, layers=LAYERS, heads=HEADS, **kw):
    return GenerationEdits(parse_interventions(spec, "test"), num_layers=layers, num_heads=heads, **kw)


def test_frame_bias_adds_up_leaves_the_query_block_alone_and_is_built_once_per_layout():
    spec = [
        {"edit": "logit_bias", "heads": ["L1H1", "L1H2"], "key_frames": "cached", "bias": -1.5},
        {"edit": "logit_bias", "heads": ["L1H1"], "key_frames": [3], "bias": 0.5},
        {"edit": "mask_keys", "heads": ["L1H2"], "key_frames": [0]},
        {"edit": "mask_keys", "heads": ["L2H3"], "key_frames": "sink"},
    ]
    edits = _edits(spec, sink_frames=(0, 1))
    layout = AttentionLayout.whole_frames((6, 7, 8), (0, 1, 3, 4, 6, 7, 8), FSL)
    bias = edits.frame_bias(0, layout)
    expected = np.zeros((HEADS, 7), np.float32)
    expected[0, :4] = [-1.5, -1.5, -1.0, -1.5]
    expected[1, :4] = [-np.inf, -1.5, -1.5, -1.5]
    assert bias.dtype == torch.float32 and np.array_equal(bias.numpy(), expected)
    assert edits.frame_bias(0, layout) is bias  # memoized per (layer, layout)
    layer1 = edits.frame_bias(1, layout).numpy()
    assert np.array_equal(layer1[2], [-np.inf, -np.inf, 0, 0, 0, 0, 0]) and not layer1[[0, 1, 3]].any()
    assert edits.frame_bias(2, layout) is None  # no edited head in this layer
    assert edits.frame_bias(0, AttentionLayout.whole_frames((0, 1, 2), (0, 1, 2), FSL)) is None  # block 0
    assert policy_from_options(demo(), options([]), frame_seq_length=FSL).edits is None  # the unedited path
    zero = _edits([{"edit": "logit_bias", "heads": "all", "key_frames": "cached", "bias": 0.0}])
    assert not zero.edits_attention and all(zero.frame_bias(layer, layout) is None for layer in range(LAYERS))


# -- cache edits --------------------------------------------------------------------------------


def fill_blocks(policy, blocks, *, seed=0, per_block=None):
    """Self-Forcing's calls on a policy with random roped keys (3 calls a block): per block the
    first call, a step, the cache pass; ``per_block(start)`` runs before each block's first call.
    Returns the un-roped keys and the values each frame got last, per layer."""
    cache = policy.cache
    g = torch.Generator().manual_seed(seed)
    layers, (_, _, _, heads, dim) = cache.num_layers, cache.k.shape
    raw = [dict() for _ in range(layers)]
    start = 0
    for size in blocks:
        if per_block is not None:
            per_block(start)
        for _ in range(3):
            policy.begin_call(start, size, grid=GRID)
            phases = demo().rope.phases(start, size, *GRID, cache.device, torch.float32)
            for layer in range(layers):
                k_raw = torch.randn(1, size * FSL, heads, dim, generator=g) + torch.randn(1, 1, heads, dim, generator=g)
                v = torch.randn(1, size * FSL, heads, dim, generator=g)
                k = apply_rope(k_raw, phases)
                policy.attend(layer, k, k, v)
                for i in range(size):
                    raw[layer][start + i] = (k_raw[:, i * FSL : (i + 1) * FSL], v[:, i * FSL : (i + 1) * FSL])
        start += size
    return raw


def demo_policy(spec, policy="global", frames=12, seed=0, **kw):
    built = new_policy(demo(), policy, frame_seq_length=FSL, num_frames=frames, **kw)
    built.edits = generation_edits(parse_interventions(spec, "test"), built, seed=seed)
    return built


@pytest.mark.parametrize("format,tensors", [("int8", "both"), ("nvfp4", "both"), ("int4", "k"), ("fp8_e4m3", "v")])
def test_quantize_cache_stores_each_finished_block_as_its_roundtrip_once(format, tensors):
    policy = demo_policy([{"edit": "quantize_cache", "format": format, "tensors": tensors}])
    cache = policy.cache
    expected = {}

    def check_then_snapshot(start):
        # What the cache pass stored for the finished block, quantized once when the next begins.
        for (lo, hi), (k, v) in expected.items():
            assert torch.equal(cache.k[:, :, lo:hi], k) and torch.equal(cache.v[:, :, lo:hi], v), (format, lo)
        if start:
            lo, hi = (start - 3) * FSL, start * FSL
            pairs = [
                quantize_cache(cache.k[layer, :, lo:hi], cache.v[layer, :, lo:hi], format, tensors)
                for layer in range(LAYERS)
            ]
            expected[(lo, hi)] = tuple(torch.stack(t) for t in zip(*pairs))

    fill_blocks(policy, [3, 3, 3, 3], per_block=check_then_snapshot)
    check_then_snapshot(0)  # the earlier blocks stay quantized once
    untouched_tail = cache.k[:, :, 9 * FSL : 12 * FSL]
    assert not torch.equal(untouched_tail, quantize_cache(untouched_tail, untouched_tail, format, "both")[0])


def test_quantize_cache_edits_frames_that_compression_keeps_in_part_token_by_token():
    compression = dict(local_attn_frames=8, sink_frames=2, budget_frames=6, recent_frames=3, largest_block=3)
    policy = demo_policy(
        [{"edit": "quantize_cache", "format": "int8", "tensors": "k"}],
        policy="participative_compression",
        **compression,
    )
    raw = fill_blocks(policy, [3, 3, 3, 3, 3])
    segments = policy.cache.segments_of(0)
    assert any(not s.whole for s in segments) and max(s.frame for s in segments) == 14
    offset, checked = 0, 0
    for segment in segments:
        # Frames after the sink (which moves in RoPE after its edit), before the current block.
        if 2 <= segment.frame < 12 and segment.shift == 0:
            phases = demo().rope.phases(segment.frame, 1, *GRID, "cpu", torch.float32)
            written = apply_rope(raw[0][segment.frame][0], phases)
            index = torch.from_numpy(segment.token_index().copy())
            expected = quantize_cache(written, written, "int8", "k")[0][:, index]
            assert torch.equal(policy.cache.k[0, :, offset : offset + segment.length], expected), segment
            checked += segment.length
        offset += segment.length
    assert checked >= FSL


def test_replace_frames_from_a_frame_stores_its_keys_re_roped_and_noise_is_seeded():
    policy = demo_policy([{"edit": "replace_frames", "key_frames": [4, 5], "source": 1}])
    raw = fill_blocks(policy, [3, 3, 3, 3])
    cache = policy.cache
    for layer in range(LAYERS):
        k_src, v_src = raw[layer][1]
        for frame in (4, 5):
            stored = cache.k[layer, :, frame * FSL : (frame + 1) * FSL]
            phases = demo().rope.phases(frame, 1, *GRID, "cpu", torch.float64)
            assert float((stored.double() - apply_rope(k_src.double(), phases)).abs().max()) < 2e-6
            assert torch.equal(cache.v[layer, :, frame * FSL : (frame + 1) * FSL], v_src)
        k3 = cache.k[layer, :, 3 * FSL : 4 * FSL]
        phases = demo().rope.phases(3, 1, *GRID, "cpu", torch.float64)
        assert float((k3.double() - apply_rope(raw[layer][3][0].double(), phases)).abs().max()) < 2e-6

    def noisy(seed):
        policy = demo_policy([{"edit": "replace_frames", "key_frames": "sink", "source": "noise"}], seed=seed)
        fill_blocks(policy, [3, 3])
        return policy.cache.k[:, :, : 6 * FSL].clone(), policy.cache.v[:, :, : 6 * FSL].clone()

    plain = new_policy(demo(), "global", frame_seq_length=FSL, num_frames=12)
    fill_blocks(plain, [3, 3])
    (k0, v0), (k1, v1), (k2, _) = noisy(0), noisy(0), noisy(1)
    assert torch.equal(k0, k1) and torch.equal(v0, v1) and not torch.equal(k0[:, :, :FSL], k2[:, :, :FSL])
    # Only the sink (frame 0 under global) is replaced; its noise has the frame's scale per channel.
    assert torch.equal(k0[:, :, FSL:], plain.cache.k[:, :, FSL : 6 * FSL]) and not torch.equal(
        k0, plain.cache.k[:, :, : 6 * FSL]
    )
    ratio = k0[:, :, :FSL].std(dim=2) / plain.cache.k[:, :, :FSL].std(dim=2)
    assert 0.4 < float(ratio.median()) < 1.6


def test_edited_generations_keep_block_0_and_move_later_frames():
    base_latents, _, _ = untouched()
    model = demo()
    for spec in (
        [{"edit": "quantize_cache", "format": "int8", "tensors": "both"}],
        [{"edit": "replace_frames", "key_frames": "cached", "source": "noise"}],
    ):
        latents = generate(model, context(), options=options(spec), seed=0).latents
        assert torch.equal(latents[:, :, :3], base_latents[:, :, :3])
        assert not torch.equal(latents[:, :, 3:], base_latents[:, :, 3:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_edits_keep_block_0_mask_exactly_and_a_zero_bias_is_the_identity():
    model = build_model(SMALL, seed=0, device="cuda", dtype=torch.bfloat16)
    ctx = context().cuda()

    def captured(spec):
        capture = FrameStatsCapture(model, [0, 2], frame_seq_length=FSL, token_profiles="none")
        with capture:
            latents = generate(model, ctx, options=options(spec), seed=0, observers=[capture]).latents
        return latents, capture.layer_tables(kinds=("frames",))

    base, base_rows = captured([])
    latents, rows = captured([{"edit": "logit_bias", "heads": "all", "key_frames": [0], "bias": 0.0}])
    assert torch.equal(latents, base)
    pd.testing.assert_frame_equal(rows[0]["frames"], base_rows[0]["frames"])
    for spec in (NO_SINK, [{"edit": "quantize_cache", "format": "nvfp4", "tensors": "both"}]):
        latents, rows = captured(spec)
        assert torch.equal(latents[:, :, :3], base[:, :, :3]) and not torch.equal(latents, base)
        table = rows[0]["frames"]
        pd.testing.assert_frame_equal(
            table[table["block"] == 0], base_rows[0]["frames"][base_rows[0]["frames"]["block"] == 0]
        )
        if spec is NO_SINK:
            masked = table[(table["block"] > 0) & (table["key_frame"] == 0)]
            assert (masked.loc[masked["head"] == 0, "prob_mass"] == 0).all()
            assert (masked.loc[masked["head"] != 0, "prob_mass"] > 0).all()


def test_frames_a_re_cache_rewrites_are_quantized_again_when_the_next_block_starts(monkeypatch):
    from sinkscope.generation import loop

    opts = options([{"edit": "quantize_cache", "format": "int8", "tensors": "both"}], 9, re_cache=True)
    built, snapshots = [], {}
    build = loop.policy_from_options
    monkeypatch.setattr(loop, "policy_from_options", lambda *a, **kw: built.append(build(*a, **kw)) or built[-1])

    class Watch:
        def begin_call(self, info):
            if info.block == 2 and info.pass_ == "denoise" and info.step in (0, 1):
                cache = built[0].cache
                snapshots[info.step] = (cache.k.clone(), cache.v.clone(), list(cache.frames(0)))

    other = torch.randn(1, 5, SMALL.text_dim, generator=torch.Generator().manual_seed(2))
    result = generate(demo(), [(0, context()), (6, other)], options=opts, seed=0, observers=[Watch()])
    assert [c.pass_ for c in result.calls].count("recache") == 1
    k_fresh, v_fresh, held = snapshots[0]  # after the re-cache call, before block 2 begins
    k_edited, v_edited, _ = snapshots[1]  # block 2 has begun: its earlier frames are edited
    assert held == list(range(6))
    stored = slice(0, 6 * FSL)
    expected = quantize_cache(k_fresh[:, :, stored], v_fresh[:, :, stored], "int8", "both")
    assert torch.equal(k_edited[:, :, stored], expected[0]) and torch.equal(v_edited[:, :, stored], expected[1])
    assert not torch.equal(k_fresh[:, :, stored], expected[0])
