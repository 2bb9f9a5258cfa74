"""KV-cache policies: at every attention call, the softmax sees the right keys at the right positions.

The checks are independent of the policy code: the keys a call must see are rebuilt from
the un-roped keys the model produced (recorded at ``WanSelfAttention.project``), roped by
a plain float64 cos/sin implementation at the position the layout states, and the
layouts are compared with schedules written here from the code traces in
/work/shared/reference/cache-policies-as-coded.md (docs/cache-policies.md).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import REPO
from test_model import TINY, tiny_model

from sinkscope.generation.common import NoiseStream
from sinkscope.generation.sampler import generate, seeded_noise
from sinkscope.model import KVCache, build_model
from sinkscope.model.cache import Segment, whole_frames
from sinkscope.model.policies import MAX_REUSE, ParticipativeCompressionPolicy, new_policy
from sinkscope.options import GenerationOptions, OptionsError

FSL = TINY.frame_seq_length()  # 6 tokens a frame: a 2 x 3 patch grid
GRID_W = TINY.latent_width // 2
HEADS, HEAD_DIM = TINY.num_heads, TINY.head_dim


# -- an independent RoPE -----------------------------------------------------------------


def rope_reference(x: torch.Tensor, t: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> torch.Tensor:
    """Wan's 3-axis RoPE in plain float64 cos/sin: x [B, L, H, D], positions per token."""
    d = x.shape[-1]
    dims = (d - 4 * (d // 6), 2 * (d // 6), 2 * (d // 6))
    angles = np.concatenate(
        [
            np.outer(pos.astype(np.float64), 1.0 / 10000.0 ** (np.arange(0, dim, 2) / dim))
            for pos, dim in zip((t, rows, cols), dims)
        ],
        axis=1,
    )  # [L, D/2]
    cos = torch.from_numpy(np.cos(angles))[None, :, None, :]
    sin = torch.from_numpy(np.sin(angles))[None, :, None, :]
    even, odd = x.double()[..., 0::2], x.double()[..., 1::2]
    out = torch.empty_like(x, dtype=torch.float64)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def layout_tokens(layout) -> list[tuple[int, int]]:
    """(frame, token within the frame) of every key token, in k's order."""
    index = layout.key_token_index
    out, at = [], 0
    for frame, length in zip(layout.key_frames, layout.key_lengths):
        tokens = range(length) if index is None else index[at : at + length]
        out.extend((frame, int(j)) for j in tokens)
        at += length
    return out


# -- recording every call ----------------------------------------------------------------------


class Probe:
    """Records the un-roped keys each layer produced and what every call's softmax saw."""

    def __init__(self, model, reference=None):
        self.raw = [dict() for _ in model.blocks]  # layer -> frame -> [B, fsl, H, D] of the last write
        self.pending = {}
        self.calls = []  # per call: list over layers of (layout, q, k)
        self.reference = reference
        self.max_error = 0.0
        for layer, block in enumerate(model.blocks):
            attn = block.self_attn
            project = attn.project

            def recording(h, layer=layer, project=project):
                q, k, v = project(h)
                self.pending[layer] = k.detach().clone()
                return q, k, v

            attn.project = recording
            attn.observer = lambda q, k, v, layout, layer=layer: self.observe(layer, q, k, layout)

    def observe(self, layer, q, k, layout):
        raw = self.pending.pop(layer)
        for i, frame in enumerate(layout.query_frames):
            self.raw[layer][frame] = raw[:, i * FSL : (i + 1) * FSL]
        if layer == 0:
            self.calls.append([])
        self.calls[-1].append((layout, q.clone(), k.clone()))
        assert k.shape[1] == layout.num_keys == sum(layout.key_lengths)
        expected = self.expected_keys(layer, layout)
        self.max_error = max(self.max_error, float((k - expected).abs().max()))
        torch.testing.assert_close(k, expected, rtol=1e-10, atol=1e-10)
        if self.reference is not None:
            self.reference.step(layer, q, k, layout, self)

    def expected_keys(self, layer, layout, shifts=None) -> torch.Tensor:
        """Each key token's recorded raw key, roped at frame + key_position_shift."""
        shifts = layout.key_position_shift if shifts is None else shifts
        parts, at = [], 0
        index = layout.key_token_index
        for frame, length, shift in zip(layout.key_frames, layout.key_lengths, shifts):
            tokens = np.arange(length) if index is None else np.array(index[at : at + length])
            at += length
            keys = self.raw[layer][frame][:, torch.from_numpy(tokens)]
            parts.append(rope_reference(keys, np.full(length, frame + shift), tokens // GRID_W, tokens % GRID_W))
        return torch.cat(parts, dim=1)


def rollout(policy_name, blocks, *, steps=2, seed=0, reference=None, **kw):
    """Self-Forcing's block procedure on the tiny float64 model: steps + 1 calls a block, random inputs."""
    model = tiny_model()
    policy = new_policy(
        model, policy_name, frame_seq_length=FSL, num_frames=sum(blocks), largest_block=max(blocks), **kw
    )
    probe = Probe(model, reference)
    g = torch.Generator().manual_seed(seed)
    context = torch.randn(1, 5, TINY.text_dim, generator=g, dtype=torch.float64)
    start = 0
    for size in blocks:
        for call in range(steps + 1):
            x = torch.randn(
                1, TINY.in_dim, size, TINY.latent_height, TINY.latent_width, generator=g, dtype=torch.float64
            )
            t = torch.full((1, size), 1000.0 * (1 - call / (steps + 1)), dtype=torch.float64)
            model(x, t, context, cache_policy=policy, start_frame=start)
        start += size
    return policy, probe


# -- schedules written from the code traces -----------------------------------------------------


def frame_schedule(policy, blocks, calls_per_block, *, window=-1, sink=0):
    """Per call: (query frames, [(key frame, position shift)]) for the frame-granular policies."""
    held, shift, base, out, start = [], {}, None, [], 0
    for size in blocks:
        overflow = len(held) + size - window if policy != "global" else 0
        if overflow > 0:
            del held[sink : sink + overflow]  # FIFO behind the sink
        held += range(start, start + size)
        if overflow > 0 and policy == "deep_sink":
            desired = start - window  # causal_model_DS.py: cs - (21 - S) - S with a full cache
            if base is not None:
                for f in held[:sink]:
                    shift[f] = shift.get(f, 0) + desired - base
            base = desired
        if policy == "rerope_sink":
            p0 = held[sink] - sink if len(held) > sink else 0  # just before the oldest working frame
            for i, f in enumerate(held[:sink]):
                shift[f] = p0 + i - f
        for _ in range(calls_per_block):
            out.append((tuple(range(start, start + size)), [(f, shift.get(f, 0)) for f in held]))
        start += size
    return out


def assert_schedule(probe, schedule):
    assert len(probe.calls) == len(schedule)
    for layers, (query, keys) in zip(probe.calls, schedule):
        for layout, _, _ in layers:
            assert layout.query_frames == query
            assert list(zip(layout.key_frames, layout.key_position_shift)) == keys
            assert set(layout.key_lengths) == {FSL} and layout.key_token_index is None
        # Frame-granular policies: one layout object serves every layer of a call.
        assert all(layout is layers[0][0] for layout, _, _ in layers)


FRAME_CASES = [
    ("global", [2, 2, 2, 2], {}),
    ("global", [1, 3, 3], {}),
    ("window", [2] * 7, dict(local_attn_frames=5)),
    ("window", [1] * 9, dict(local_attn_frames=4)),
    ("sink", [2] * 8, dict(local_attn_frames=5, sink_frames=2)),
    ("sink", [1, 2, 2, 2, 2, 2], dict(local_attn_frames=5, sink_frames=1)),
    ("deep_sink", [2] * 9, dict(local_attn_frames=5, sink_frames=2)),
    ("deep_sink", [1] * 14, dict(local_attn_frames=5, sink_frames=2)),
    ("deep_sink", [3] * 8, dict(local_attn_frames=7, sink_frames=3)),
    ("rerope_sink", [2] * 8, dict(local_attn_frames=5, sink_frames=2)),
    ("rerope_sink", [1] * 12, dict(local_attn_frames=4, sink_frames=3)),
    ("rerope_sink", [1, 2, 2, 2, 2, 2], dict(local_attn_frames=5, sink_frames=2)),
]


@pytest.mark.parametrize("policy, blocks, kw", FRAME_CASES)
def test_keys_the_softmax_sees_are_the_stated_frames_at_the_stated_positions(policy, blocks, kw):
    _, probe = rollout(policy, blocks, **kw)
    schedule = frame_schedule(policy, blocks, 3, window=kw.get("local_attn_frames", -1), sink=kw.get("sink_frames", 0))
    assert_schedule(probe, schedule)


def test_deep_sink_trace_leaves_a_one_block_gap():
    """causal_model_DS.py, S=2, W=5, blocks of 1: sink at [cs-5, cs-3), tail [cs-2, cs]."""
    _, probe = rollout("deep_sink", [1] * 9, steps=0, local_attn_frames=5, sink_frames=2)
    positions = [[f + s for f, s in zip(c[0][0].key_frames, c[0][0].key_position_shift)] for c in probe.calls]
    assert positions == [
        [0],
        [0, 1],
        [0, 1, 2],
        [0, 1, 2, 3],
        [0, 1, 2, 3, 4],
        [0, 1, 3, 4, 5],  # cs 5: first roll, delta 0 (sink base = cs - W = 0)
        [1, 2, 4, 5, 6],  # cs 6: delta +1: sink at 1..2, frame 3 (one block) missing before the tail
        [2, 3, 5, 6, 7],
        [3, 4, 6, 7, 8],
    ]
    # Blocks of 2, W=5: the first roll comes at cs 4 < W, so the sink sits at cs - 4, a 1-frame gap.
    _, probe = rollout("deep_sink", [2] * 5, steps=0, local_attn_frames=5, sink_frames=2)
    layouts = [c[0][0] for c in probe.calls]
    assert [(lay.key_frames, lay.key_position_shift) for lay in layouts[2:]] == [
        ((0, 1, 3, 4, 5), (0, 0, 0, 0, 0)),
        ((0, 1, 5, 6, 7), (2, 2, 0, 0, 0)),
        ((0, 1, 7, 8, 9), (4, 4, 0, 0, 0)),
    ]


def test_rerope_anchor_trace():
    """Anchor of 2 frames, window 5, blocks of 2: the anchor sits just before the working frames."""
    _, probe = rollout("rerope_sink", [2] * 5, steps=0, local_attn_frames=5, sink_frames=2)
    positions = [[f + s for f, s in zip(c[0][0].key_frames, c[0][0].key_position_shift)] for c in probe.calls]
    assert positions == [[0, 1], [0, 1, 2, 3], [1, 2, 3, 4, 5], [3, 4, 5, 6, 7], [5, 6, 7, 8, 9]]


def test_deep_sink_rotation_keeps_stored_sink_keys_exact_after_many_rotations():
    policy, probe = rollout("deep_sink", [1] * 30, steps=1, local_attn_frames=5, sink_frames=2)
    shifts = [s.shift for s in policy.cache.segments[0][:2]]
    assert shifts == [30 - 1 - 5 - 0] * 2  # 24 cumulative rotations of +1 since the first roll at cs 5
    for layer in range(TINY.num_layers):
        stored = policy.cache.k[layer, :, : 2 * FSL]
        layout = policy.cache.layout(layer, ())
        expected = probe.expected_keys(layer, layout)[:, : 2 * FSL]
        torch.testing.assert_close(stored, expected, rtol=0, atol=1e-12)
    assert probe.max_error < 1e-12


# -- participative compression, token by token ----------------------------------------------------


class CompressionReference:
    """Deep Forcing DS+PC (causal_model.py §1.3 of the doc) recomputed from the recorded q and k."""

    def __init__(self, *, window, sink, budget, recent, max_reuse):
        self.W, self.S, self.N, self.R, self.max_reuse = window, sink, budget, recent, max_reuse
        self.state = {}
        self.compressions = 0
        self.cap_changed_selection = 0

    def step(self, layer, q, k, layout, probe):
        st = self.state.setdefault(
            layer, dict(win_q=None, ids=[], keys=None, counts={}, base=None, shift={}, block=None)
        )
        st["win_q"] = (q if st["win_q"] is None else torch.cat([st["win_q"], q], dim=1))[:, -self.R * FSL :]
        query = layout.query_frames
        new_ids = [(f, j) for f in query for j in range(FSL)]
        if query != st["block"]:
            st["block"] = query
            if len(st["ids"]) + len(new_ids) > self.W * FSL:
                self.compress(st, query[0], new_ids, probe.expected_keys(layer, _whole(query), [0] * len(query)))
            else:
                st["ids"] = st["ids"] + new_ids
        assert layout_tokens(layout) == st["ids"], f"layer {layer}, block at {query[0]}"
        assert layout.key_position_shift == tuple(st["shift"].get(f, 0) for f in layout.key_frames)
        st["keys"] = k.clone()

    def compress(self, st, cs, new_ids, new_keys):
        ids = st["ids"] + new_ids
        keys = torch.cat([st["keys"], new_keys], dim=1)
        total = len(ids)
        recent = min(st["win_q"].shape[1], total)
        sink = min(self.S * FSL, total)
        cap = min(max(min(self.N, self.W) * FSL, sink + recent), total)
        top_c = cap - sink - recent
        qsum = st["win_q"][:, -recent:].sum(1).flatten(1)  # [B, H*D]
        scores = (keys.flatten(2) @ qsum[..., None])[0, :, 0] / (math.sqrt(HEAD_DIM) * HEADS)
        span = range(sink, total - recent)
        eligible = [j for j in span if st["counts"].get(ids[j], 0) < self.max_reuse]
        ranked = sorted(eligible, key=lambda j: -float(scores[j]))
        top = sorted(ranked[:top_c])
        unconstrained = set(sorted(span, key=lambda j: -float(scores[j]))[:top_c])
        self.cap_changed_selection += len(unconstrained - set(top))
        for j in top:
            st["counts"][ids[j]] = st["counts"].get(ids[j], 0) + 1
        keep = list(range(sink)) + top + list(range(total - recent, total))
        st["ids"] = [ids[j] for j in keep]
        # Deep Sink: desired = cs - tail - S; first time by W - N (DF: 21 - budget).
        desired = cs - (len(keep) - self.S * FSL) // FSL - self.S
        delta = self.W - self.N if st["base"] is None else desired - st["base"]
        st["base"] = desired
        for f in range(self.S):
            st["shift"][f] = st["shift"].get(f, 0) + delta
        self.compressions += 1


def _whole(frames):
    from sinkscope.model.layout import AttentionLayout

    return AttentionLayout.whole_frames(frames, frames, FSL)


PC_CASES = [
    ([1] * 16, dict(local_attn_frames=6, sink_frames=1, budget_frames=4, recent_frames=2), MAX_REUSE),
    ([2] * 10, dict(local_attn_frames=7, sink_frames=2, budget_frames=5, recent_frames=2), MAX_REUSE),
    ([1, 3, 3, 3, 3, 3, 3, 3], dict(local_attn_frames=9, sink_frames=2, budget_frames=7, recent_frames=4), MAX_REUSE),
    ([1] * 40, dict(local_attn_frames=5, sink_frames=1, budget_frames=4, recent_frames=1), 2),
]


@pytest.mark.parametrize("blocks, kw, max_reuse", PC_CASES)
def test_participative_compression_keeps_the_brute_force_top_c(blocks, kw, max_reuse):
    reference = CompressionReference(
        window=kw["local_attn_frames"],
        sink=kw["sink_frames"],
        budget=kw["budget_frames"],
        recent=kw["recent_frames"],
        max_reuse=max_reuse,
    )
    policy, probe = rollout("participative_compression", blocks, reference=reference, max_reuse=max_reuse, **kw)
    assert reference.compressions >= 2 * TINY.num_layers
    # Tokens were dropped from the middle frames, and the layers chose differently.
    assert any(length < FSL for length in probe.calls[-1][0][0].key_lengths)
    assert any(layout_tokens(layers[0][0]) != layout_tokens(layers[1][0]) for layers in probe.calls)
    if max_reuse == 2:
        assert reference.cap_changed_selection > 0, "the max-reuse cap never mattered"
    # The buffer never grows past the window plus the block being compressed.
    assert policy.cache.capacity_frames == kw["local_attn_frames"] + max(blocks)


def test_participative_compression_reads_its_choice_back_lazily():
    """Unobserved layers resolve their metadata late: the same cache as when read every call."""
    kw = dict(local_attn_frames=6, sink_frames=1, budget_frames=4, recent_frames=2, max_reuse=2)
    observed, _ = rollout("participative_compression", [1] * 20, **kw)
    model = tiny_model()
    quiet = new_policy(model, "participative_compression", frame_seq_length=FSL, largest_block=1, **kw)
    g = torch.Generator().manual_seed(0)
    context = torch.randn(1, 5, TINY.text_dim, generator=g, dtype=torch.float64)
    for start in range(20):
        for call in range(3):
            x = torch.randn(1, TINY.in_dim, 1, TINY.latent_height, TINY.latent_width, generator=g, dtype=torch.float64)
            t = torch.full((1, 1), 1000.0 * (1 - call / 3), dtype=torch.float64)
            model(x, t, context, cache_policy=quiet, start_frame=start)
    assert quiet.cache._deferred  # nothing read the last choices yet
    for layer in range(TINY.num_layers):
        for a, b in zip(quiet.cache.token_metadata(layer), observed.cache.token_metadata(layer)):
            assert np.array_equal(a, b)
        assert np.array_equal(quiet.counts(layer), observed.counts(layer))
        assert quiet.cache.length(layer) == observed.cache.length(layer)
        torch.testing.assert_close(quiet.cache.keys(layer)[0], observed.cache.keys(layer)[0], rtol=0, atol=0)


def test_participative_compression_defaults_trace():
    """Defaults (W 21, S 10, N 16, R 4, blocks of 3): compression and sink moves every other block."""
    _, probe = rollout(
        "participative_compression",
        [3] * 14,
        steps=0,
        local_attn_frames=21,
        sink_frames=10,
        budget_frames=16,
        recent_frames=4,
    )
    sink_positions = {}
    sizes = []
    for layers in probe.calls:
        layout = layers[0][0]
        sink_positions[layout.query_frames[0]] = layout.key_position_shift[0]
        sizes.append(layout.num_keys // FSL)
    # cs 21: delta 21 - 16 = 5; then +6 at cs 27, 33, 39 (DF trace: sink @5..14, @11..20, ...).
    assert [sink_positions[cs] for cs in (18, 21, 24, 27, 30, 33, 36, 39)] == [0, 5, 5, 11, 11, 17, 17, 23]
    assert sizes[6:] == [21, 16, 19, 16, 19, 16, 19, 16]


# -- generate() with every policy -------------------------------------------------------------------

SMALL = {
    "global": {},
    "window": dict(local_attn_frames=6),
    "sink": dict(local_attn_frames=6, sink_frames=3),
    "deep_sink": dict(local_attn_frames=9, sink_frames=3),
    "participative_compression": dict(local_attn_frames=9, sink_frames=2, budget_frames=6, recent_frames=3),
    "rerope_sink": dict(local_attn_frames=9, sink_frames=3),
    "rolling_sink": dict(local_attn_frames=9, sink_frames=3),
    "relative_rope": dict(local_attn_frames=6, sink_frames=1),
    "ema_sink": dict(local_attn_frames=9, sink_frames=3),
}


@pytest.mark.parametrize("policy", list(SMALL))
def test_generate_runs_every_policy_with_a_cache_independent_of_the_video_length(policy):
    model = build_model("demo", seed=0)
    context = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(1))
    results = {}
    for frames in (12, 24):
        options = GenerationOptions.from_config(
            dict(cache_policy=policy, num_frames=frames, denoising_steps=[1000], **SMALL[policy])
        )
        results[frames] = generate(model, context, options=options, seed=0)
        latents = results[frames].latents
        assert latents.device.type == "cpu" and latents.shape[2] == frames
        assert torch.isfinite(latents).all()
        calls = results[frames].calls
        assert [c.is_last_block for c in calls] == [c.block == frames // 3 - 1 for c in calls]
    if policy == "global":
        assert results[24].kv_cache_bytes == 2 * results[12].kv_cache_bytes
    else:
        assert results[24].kv_cache_bytes == results[12].kv_cache_bytes


@pytest.mark.slow
def test_generate_with_policy_defaults_past_the_first_eviction():
    model = build_model("demo", seed=0)
    context = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(1))
    for policy in (
        "deep_sink",
        "participative_compression",
        "rerope_sink",
        "rolling_sink",
        "relative_rope",
        "ema_sink",
    ):
        options = GenerationOptions.from_config(dict(cache_policy=policy, num_frames=30, denoising_steps=[1000]))
        assert torch.isfinite(generate(model, context, options=options, seed=0).latents).all()


@pytest.mark.parametrize("shape", [(16, 8, 12), (16, 3, 5), (5, 3, 3), (3, 1, 1)])
def test_noise_stream_equals_one_up_front_draw(shape):
    frames, steps, blocks = 21, 4, [3] * 7
    renoise = frames * (steps - 1)
    one_draw = seeded_noise(7, (frames + renoise, *shape))
    stream = NoiseStream(7, frames, shape, renoise)
    parts = [stream.initial] + [stream.renoise(b) for b in blocks for _ in range(steps - 1)]
    assert torch.equal(torch.cat(parts), one_draw)
    assert stream.streaming == (math.prod(shape) % 16 == 0)


# -- the storage primitives ----------------------------------------------------------------------------


def _filled_cache(frames=6, fsl=3, layers=2):
    cache = KVCache(
        num_layers=layers, batch_size=1, num_heads=1, head_dim=6, frame_seq_length=fsl, capacity_frames=frames
    )
    cache.append(whole_frames(range(frames), fsl))
    values = torch.arange(frames * fsl, dtype=torch.float32).view(1, -1, 1, 1).expand(1, -1, 1, 6)
    for layer in range(layers):
        cache.write_tail(layer, values + 100 * layer, values)
    return cache


def test_evict_moves_the_tail_left_in_chunks_for_every_layer():
    cache = _filled_cache(frames=7, fsl=2)
    cache.evict(2, after=1)  # drop frames 1, 2: four chunks of 2 frames' worth... of tokens
    assert cache.frames(0) == cache.frames(1) == [0, 3, 4, 5, 6]
    assert cache.segments[0] is cache.segments[1]
    k, v = cache.keys(1)
    assert k[0, :, 0, 0].tolist() == [100 + t for t in [0, 1, 6, 7, 8, 9, 10, 11, 12, 13]]
    assert v[0, :, 0, 0].tolist() == [0, 1, 6, 7, 8, 9, 10, 11, 12, 13]


def test_keep_compacts_tokens_in_order_with_their_metadata():
    cache = _filled_cache(frames=4, fsl=3)
    cache.keep(1, np.array([0, 1, 2, 4, 8, 9, 10, 11]))
    assert cache.frames(0) == [0, 1, 2, 3]
    assert cache.frames(1) == [0, 1, 2, 3] and cache.length(1) == 8
    frames, tokens, _ = cache.token_metadata(1)
    assert frames.tolist() == [0, 0, 0, 1, 2, 3, 3, 3] and tokens.tolist() == [0, 1, 2, 1, 2, 0, 1, 2]
    assert cache.keys(1)[0][0, :, 0, 0].tolist() == [100 + t for t in [0, 1, 2, 4, 8, 9, 10, 11]]
    layout = cache.layout(1, (3,))
    assert layout.key_lengths == (3, 1, 1, 3) and layout.key_token_index.tolist() == tokens.tolist()
    assert cache.layout(0, (3,)).key_token_index is None


def test_rotate_moves_keys_to_another_position_in_place():
    tables = tiny_model().rope
    x = torch.randn(1, 2 * FSL, HEADS, HEAD_DIM, dtype=torch.float64)
    cache = KVCache(
        num_layers=1,
        batch_size=1,
        num_heads=HEADS,
        head_dim=HEAD_DIM,
        frame_seq_length=FSL,
        capacity_frames=2,
        dtype=torch.float64,
    )
    cache.append(whole_frames([0, 1], FSL, positions=[4, 5]))
    tokens = np.tile(np.arange(FSL), 2)
    cache.write_tail(0, rope_reference(x, np.repeat([4, 5], FSL), tokens // GRID_W, tokens % GRID_W), x)
    for delta in (3, -2, 7):
        cache.rotate(0, 2, delta, tables.temporal_angles(delta, "cpu"))
    assert [s.position for s in cache.segments[0]] == [12, 13]
    expected = rope_reference(x, np.repeat([12, 13], FSL), tokens // GRID_W, tokens % GRID_W)
    torch.testing.assert_close(cache.keys(0)[0], expected, rtol=0, atol=1e-12)


def test_segment_shift_and_whole():
    seg = Segment(frame=3, length=2, position=7, tokens=np.array([1, 4]))
    assert seg.shift == 4 and not seg.whole and seg.token_index().tolist() == [1, 4]


# -- configuration errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config, key",
    [
        (dict(cache_policy="fifo"), "generation.cache_policy"),
        (dict(cache_policy="deep_sink", sink_frames=0), "generation.sink_frames"),
        (dict(cache_policy="rerope_sink", sink_frames=0), "generation.sink_frames"),
        (dict(cache_policy="window", sink_frames=2), "generation.sink_frames"),
        (dict(cache_policy="global", local_attn_frames=9), "generation.local_attn_frames"),
        (dict(cache_policy="deep_sink", budget_frames=12), "generation.budget_frames"),
        (dict(cache_policy="sink", recent_frames=2), "generation.recent_frames"),
        (dict(cache_policy="sink", local_attn_frames=5, sink_frames=3), "generation.local_attn_frames"),
        (dict(cache_policy="participative_compression", recent_frames=2), "generation.recent_frames"),
        (dict(cache_policy="participative_compression", budget_frames=12), "generation.budget_frames"),
        (
            dict(cache_policy="participative_compression", budget_frames=22, local_attn_frames=21),
            "generation.budget_frames",
        ),
        (
            dict(cache_policy="participative_compression", local_attn_frames=12),
            "generation.local_attn_frames|budget_frames",
        ),
    ],
)
def test_bad_combinations_name_the_key(config, key):
    with pytest.raises(OptionsError, match=key):
        GenerationOptions.from_config(config)


def test_compression_needs_batch_size_one():
    model = tiny_model()
    with pytest.raises(ValueError, match="batch size 1"):
        new_policy(
            model,
            "participative_compression",
            frame_seq_length=FSL,
            local_attn_frames=6,
            sink_frames=1,
            budget_frames=4,
            recent_frames=2,
            batch_size=2,
        )
    assert ParticipativeCompressionPolicy.name == "participative_compression"


# -- one entry per policy: the spec, the registered class, the schema and the config comment --


def test_every_policy_spec_has_exactly_one_registered_class_and_back():
    from sinkscope.model.policies import POLICY_CLASSES, CachePolicy
    from sinkscope.options import CACHE_POLICY_TABLE

    assert sorted(POLICY_CLASSES) == sorted(CACHE_POLICY_TABLE)
    assert len(set(POLICY_CLASSES.values())) == len(POLICY_CLASSES)  # no class under two names
    for name, cls in POLICY_CLASSES.items():
        assert issubclass(cls, CachePolicy) and cls.name == name


def test_register_policy_refuses_a_name_without_a_spec_and_a_second_class():
    from sinkscope.model.policies import SinkPolicy, register_policy

    class Unlisted(SinkPolicy):
        name = "no_such_policy"

    class Again(SinkPolicy):
        name = "sink"

    with pytest.raises(ValueError, match="no row in sinkscope.options.CACHE_POLICY_TABLE"):
        register_policy(Unlisted)
    with pytest.raises(ValueError, match="registered already"):
        register_policy(Again)


def test_a_new_policy_is_its_spec_row_and_its_registered_class(monkeypatch):
    """The extension point end to end: a spec row and a decorated class are all that
    ``GenerationOptions`` and ``new_policy`` need."""
    from sinkscope.model.policies import POLICY_CLASSES, WindowPolicy, policy_from_options, register_policy
    from sinkscope.options import CACHE_POLICY_TABLE, PolicySpec

    spec = PolicySpec(
        "toy_window",
        {"local_attn_frames": 4, "sink_frames": 0, "budget_frames": 0, "recent_frames": 0},
        ("local_attn_frames",),
        "a test's FIFO window",
    )
    monkeypatch.setitem(CACHE_POLICY_TABLE, spec.name, spec)
    try:

        @register_policy
        class ToyWindowPolicy(WindowPolicy):
            name = "toy_window"

        options = GenerationOptions.from_config({"num_frames": 6, "frames_per_block": 2, "cache_policy": "toy_window"})
        policy = policy_from_options(tiny_model(), options, frame_seq_length=FSL)
        assert type(policy) is ToyWindowPolicy and policy.window_frames == 4 and policy.spec is spec
        assert policy.cache.capacity_frames == options.cache_capacity_frames == 4
    finally:
        POLICY_CLASSES.pop("toy_window", None)


def test_the_schema_enums_list_the_registered_names():
    from sinkscope.generation.procedures import PROCEDURES
    from sinkscope.options import CACHE_POLICY_TABLE, PROCEDURE_TABLE, option_owners
    from sinkscope.schema import load_schema, resolve_ref
    from sinkscope.schemafile import read_schema_file

    generation = resolve_ref(load_schema()["properties"]["generation"])["properties"]
    assert generation["cache_policy"]["enum"] == [*CACHE_POLICY_TABLE, None]
    assert generation["procedure"]["enum"] == list(PROCEDURE_TABLE) and sorted(PROCEDURES) == sorted(PROCEDURE_TABLE)
    for key, names in (("cache_policy", CACHE_POLICY_TABLE), ("procedure", PROCEDURE_TABLE)):
        described = generation[key]["description"]
        assert [name for name in names if name not in described] == [], key
    # Every key a policy or procedure declares, typed by its default or listed by its choices.
    for key, (_, owner, option) in option_owners().items():
        node = generation[key]
        assert node["description"].startswith(f"{owner}: {option.description}"), key
        if option.choices:
            assert node["enum"] == [*option.choices, None], key
        else:
            assert node["type"] == {bool: "boolean", int: "integer", float: "number"}[type(option.default)], key
    # The file names none of them: a new policy or procedure is its row and its module.
    written = read_schema_file()["$defs"]["generation"]["properties"]
    assert "enum" not in written["cache_policy"] and "enum" not in written["procedure"]
    assert not set(option_owners()) & set(written)
    # config.yaml names the default and points to the list (no second list to keep true).
    line = next(
        line for line in (REPO / "config.yaml").read_text().splitlines() if line.strip().startswith("cache_policy:")
    )
    assert line.split(":", 1)[1].split("#", 1)[0].strip() in CACHE_POLICY_TABLE


def test_a_declared_key_is_typed_by_its_default_in_the_schema(monkeypatch):
    """A policy's own keys reach the schema from its spec: an integer refuses text, a key
    whose default is None takes any value; both refused under another policy."""
    from sinkscope.errors import ConfigError
    from sinkscope.options import CACHE_POLICY_TABLE, OptionSpec, PolicySpec
    from sinkscope.pipeline.study import load_study
    from sinkscope.schema import load_schema

    spec = PolicySpec(
        "toy_typed",
        {"local_attn_frames": -1, "sink_frames": 0, "budget_frames": 0, "recent_frames": 0},
        (),
        "a test's global cache with two keys",
        options=(OptionSpec("toy_count", 2, description="a count."), OptionSpec("toy_any", None)),
        bounded=False,
    )
    monkeypatch.setitem(CACHE_POLICY_TABLE, spec.name, spec)
    generation = load_schema()["$defs"]["generation"]["properties"]
    assert generation["toy_count"] == {"type": "integer", "default": 2, "description": "toy_typed: a count."}
    assert "type" not in generation["toy_any"] and generation["toy_any"]["default"] is None

    def check(**given):
        return load_study({"generation": {"cache_policy": "toy_typed", **given}}, check_this_machine=False)

    assert check(toy_count=5, toy_any=[1, "a"]).options["demo"].option("toy_count") == 5
    with pytest.raises(ConfigError, match="config key generation.toy_count: 'five' is not an integer"):
        check(toy_count="five")
    with pytest.raises(ConfigError, match="generation.toy_count: has no meaning for cache_policy 'window'"):
        load_study({"generation": {"cache_policy": "window", "toy_count": 5}}, check_this_machine=False)


def test_combinations_that_would_quietly_mean_something_else_are_refused_in_one_line():
    """Participative compression without a sink; a variant's null window key under a policy
    that reads it (null would take the policy's default, not "no window")."""
    from sinkscope.errors import ConfigError
    from sinkscope.pipeline.study import load_study

    def check(config):
        return load_study(config, check_this_machine=False)

    with pytest.raises(ConfigError, match="generation.sink_frames: 0 must be at least 1 for cache_policy 'partic"):
        check({"generation": {"cache_policy": "participative_compression", "sink_frames": 0}})
    base = {"cache_policy": "sink", "local_attn_frames": 15}
    for key, default in (("local_attn_frames", 12), ("sink_frames", 3)):
        with pytest.raises(
            ConfigError,
            match=f"variants.v.{key}: null under cache_policy 'sink' would quietly take the policy's default {default}",
        ):
            check({"generation": base, "variants": {"v": {key: None}}})
    # Where null does mean "none" it stays: over the window keys' own inference it leaves the window out.
    study = check(
        {
            "generation": {"local_attn_frames": 15, "sink_frames": 3},
            "variants": {"v": {"local_attn_frames": None, "sink_frames": None}},
        }
    )
    assert study.options["demo@v"].cache_policy == "global" and study.options["demo@v"].local_attn_frames == -1
    # A key the policy does not read may be null: window's sink.
    assert check({"generation": {"cache_policy": "window"}, "variants": {"v": {"sink_frames": None}}})
