"""The newer training-free sink policies: rolling_sink, relative_rope, ema_sink.

Each is checked against a small re-implementation, written here, of its reference
procedure (docs/cache-policies.md, with the file and line references there): the
reference's own formulas (Rolling Sink's per-block segment start and reverse flag,
Infinity-RoPE's query start and KV flush, Reward Forcing's eviction and EMA blend),
tracked slot by slot over long rollouts of the tiny float64 model. Every call's q, k
and v are rebuilt from the un-roped q, k and v the model produced (recorded at
``WanSelfAttention.project``), roped by the plain float64 RoPE of test_policies at the
positions the reference gives them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_model import TINY, tiny_model
from test_policies import FSL, GRID_W, layout_tokens, rope_reference

from sinkscope.generation.capture import FrameStatsCapture
from sinkscope.generation.sampler import generate
from sinkscope.model import KVCache, build_model
from sinkscope.model.policies import EMA_DECAY, EmaSinkPolicy, new_policy
from sinkscope.model.wan import RotaryTables
from sinkscope.options import CACHE_POLICY_TABLE, GenerationOptions, OptionsError

TOKENS = np.arange(FSL)


def roped(x: torch.Tensor, position: int) -> torch.Tensor:
    """One frame's tokens [B, FSL, H, D] roped at temporal ``position`` (float64 reference)."""
    return rope_reference(x, np.full(FSL, position), TOKENS // GRID_W, TOKENS % GRID_W)


class Recorder:
    """Records the un-roped q, k, v of every layer's call and checks it against ``reference``.

    ``reference.expect(layer, query_frames, raw)`` returns, for this call, the expected
    (query positions, [(key frame, position, raw k, raw v)] in k's order); the recorder
    asserts that the q, k and v the softmax saw are those, roped, and that the layout
    names those frames and positions.
    """

    def __init__(self, model, policy, reference):
        self.policy = policy
        self.reference = reference
        self.pending = {}
        self.calls = []  # per call: [layout of each layer]
        self.max_error = 0.0
        for layer, block in enumerate(model.blocks):
            attn = block.self_attn
            project = attn.project

            def recording(h, layer=layer, project=project):
                q, k, v = project(h)
                self.pending[layer] = (q.detach().clone(), k.detach().clone(), v.detach().clone())
                return q, k, v

            attn.project = recording
            attn.observer = lambda q, k, v, layout, layer=layer: self.observe(layer, q, k, layout)

    def observe(self, layer, q, k, layout):
        raw_q, raw_k, raw_v = self.pending.pop(layer)
        if layer == 0:
            self.calls.append([])
        self.calls[-1].append(layout)
        query_positions, keys = self.reference.expect(layer, layout.query_frames, (raw_k, raw_v))
        # The layout states what the reference did.
        assert [f + layout.query_position_shift for f in layout.query_frames] == query_positions
        assert list(zip(layout.key_frames, (f + s for f, s in zip(layout.key_frames, layout.key_position_shift)))) == [
            (frame, position) for frame, position, _, _ in keys
        ], f"layer {layer}, block at {layout.query_frames[0]}"
        assert set(layout.key_lengths) == {FSL} and layout.key_token_index is None
        # The softmax saw exactly those queries, keys and values.
        expected_q = torch.cat(
            [roped(raw_q[:, i * FSL : (i + 1) * FSL], p) for i, p in enumerate(query_positions)], dim=1
        )
        expected_k = torch.cat([roped(key, position) for _, position, key, _ in keys], dim=1)
        expected_v = torch.cat([value for _, _, _, value in keys], dim=1)
        _, seen_v = self.policy.cache.keys(layer)
        for got, want in ((q, expected_q), (k, expected_k), (seen_v, expected_v)):
            self.max_error = max(self.max_error, float((got - want).abs().max()))
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def rollout(policy_name, blocks, reference, *, steps=1, seed=0, **kw):
    """Self-Forcing's block procedure on the tiny float64 model (steps + 1 calls a block)."""
    model = tiny_model()
    policy = new_policy(
        model, policy_name, frame_seq_length=FSL, num_frames=sum(blocks), largest_block=max(blocks), **kw
    )
    recorder = Recorder(model, policy, reference)
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
    return policy, recorder


def _frame(tensor, i):
    return tensor[:, i * FSL : (i + 1) * FSL].clone()


# -- Rolling Sink ------------------------------------------------------------------------------------


class RollingSinkReference:
    """Rolling Sink's causal_model.py (RS 204-285) with its pipeline (RS causal_inference.py 180-243).

    Per layer: a FIFO buffer of W frame slots (sink_size 0), each slot (frame, position,
    raw k, raw v); ``k_original``/``v_original`` of the frames of calls ending within the
    first W frames. After the attention of a block's last call (its cache pass, timestep
    0), once current_end - 3 frames >= W: cs_RS = cs - 3, R = W - 3, reverse = (cs_RS // R)
    odd; reverse: right = R - cs_RS % R, left = right - 3, frames right-1 .. left; else
    left = cs_RS % R, frames left .. left+2; written into the 3 slots before the block,
    roped at cs_RS, cs_RS + 1, cs_RS + 2. Only for blocks of 3 frames (their constant).
    """

    def __init__(self, window, calls_per_block, segment=3):
        self.W, self.S, self.calls_per_block = window, segment, calls_per_block
        self.state = {}
        self.inserted = []  # (block start, frames) of layer 0

    def expect(self, layer, query_frames, raw):
        st = self.state.setdefault(layer, dict(slots=[], original={}, block=None, call=0))
        cs, b = query_frames[0], len(query_frames)
        raw_k, raw_v = raw
        if query_frames != st["block"]:
            st["block"], st["call"] = query_frames, 0
            overflow = len(st["slots"]) + b - self.W
            if overflow > 0:
                del st["slots"][:overflow]  # FIFO, no sink
            st["slots"] += [None] * b
        st["call"] += 1
        for i, f in enumerate(query_frames):
            st["slots"][len(st["slots"]) - b + i] = (f, f, _frame(raw_k, i), _frame(raw_v, i))
            if cs + b <= self.W:  # current_end <= max_attention_size
                st["original"][f] = (_frame(raw_k, i), _frame(raw_v, i))
        keys = list(st["slots"])  # what this call attends: the whole buffer
        if st["call"] == self.calls_per_block and cs + b - self.S >= self.W:  # the cache pass
            cs_rs = cs - self.S
            r = self.W - self.S
            reverse = (cs_rs // r) % 2 == 1
            if reverse:
                right = r - cs_rs % r
                frames = list(range(right - self.S, right))[::-1]
            else:
                left = cs_rs % r
                frames = list(range(left, left + self.S))
            first = len(st["slots"]) - b - self.S
            for i, f in enumerate(frames):
                st["slots"][first + i] = (f, cs_rs + i, *st["original"][f])
            if layer == 0:
                self.inserted.append((cs, tuple(frames)))
        return [f + 0 for f in query_frames], [(f, p, k, v) for f, p, k, v in keys]


def test_rolling_sink_follows_the_reference_over_a_long_rollout():
    """Defaults (W 21, segment 3), blocks of 3, 90 frames: forward and backward sweeps."""
    reference = RollingSinkReference(window=21, calls_per_block=2)
    policy, recorder = rollout("rolling_sink", [3] * 30, reference, local_attn_frames=21, sink_frames=3)
    assert len(recorder.calls) == 60
    # The sweep the reference printed: 15..17 reversed at cs 21, down to 0..2, then forward.
    assert reference.inserted[:8] == [
        (21, (17, 16, 15)),
        (24, (14, 13, 12)),
        (27, (11, 10, 9)),
        (30, (8, 7, 6)),
        (33, (5, 4, 3)),
        (36, (2, 1, 0)),
        (39, (0, 1, 2)),
        (42, (3, 4, 5)),
    ]
    assert [frames for _, frames in reference.inserted[11:14]] == [(15, 16, 17), (17, 16, 15), (14, 13, 12)]
    # The last block (cs 87) sees 15 re-inserted frames, then the previous block and itself.
    last = recorder.calls[-1][0]
    positions = [f + s for f, s in zip(last.key_frames, last.key_position_shift)]
    assert positions == list(range(69, 90))
    assert all(f < 18 for f in last.key_frames[:15]) and last.key_frames[15:] == tuple(range(84, 90))
    # A frame can be attended twice in one call, at two positions.
    assert any(len(set(c[0].key_frames)) < len(c[0].key_frames) for c in recorder.calls)
    assert recorder.max_error < 1e-12
    # Memory: the window plus the first W - S frames' keys and values, whatever the length.
    assert policy.cache.capacity_frames == 21 and policy.raw_k.shape[2] == 18 * FSL


def test_rolling_sink_ping_pong_formula_equals_the_reference_sweep():
    policy = new_policy(tiny_model(), "rolling_sink", frame_seq_length=FSL, local_attn_frames=21, sink_frames=3)
    for cs in range(21, 400, 3):
        cs_rs, r = cs - 3, 18
        if (cs_rs // r) % 2:
            right = r - cs_rs % r
            frames = list(range(right - 3, right))[::-1]
        else:
            frames = list(range(cs_rs % r, cs_rs % r + 3))
        assert [policy.frame_at(cs_rs + i) for i in range(3)] == frames


@pytest.mark.parametrize(
    "blocks, window, segment", [([1] * 40, 7, 2), ([2] * 25, 8, 2), ([1, 3, 3, 3, 3, 3, 3, 3, 3, 3], 9, 3)]
)
def test_rolling_sink_generalizes_to_other_blocks_by_position(blocks, window, segment):
    """Blocks other than the segment (the reference would fail): position p gets frame_at(p)."""

    class PerPosition:
        def __init__(self):
            self.state = {}

        def expect(self, layer, query_frames, raw):
            st = self.state.setdefault(layer, dict(slots=[], original={}, block=None, previous=None))
            raw_k, raw_v = raw
            cs, b = query_frames[0], len(query_frames)
            r = window - segment
            if query_frames != st["block"]:
                if st["previous"] is not None:
                    ps, pb = st["previous"]
                    if ps + pb - segment >= window:
                        for p in range(ps - segment, ps):
                            sweep, offset = divmod(p, r)
                            f = offset if sweep % 2 == 0 else r - 1 - offset
                            slot = next(i for i, s in enumerate(st["slots"]) if s[1] == p)
                            st["slots"][slot] = (f, p, *st["original"][f])
                st["block"], st["previous"] = query_frames, (cs, b)
                overflow = len(st["slots"]) + b - window
                if overflow > 0:
                    del st["slots"][:overflow]
                st["slots"] += [None] * b
            for i, f in enumerate(query_frames):
                st["slots"][len(st["slots"]) - b + i] = (f, f, _frame(raw_k, i), _frame(raw_v, i))
                if f < r:
                    st["original"][f] = (_frame(raw_k, i), _frame(raw_v, i))
            return list(query_frames), list(st["slots"])

    policy, recorder = rollout("rolling_sink", blocks, PerPosition(), local_attn_frames=window, sink_frames=segment)
    shifted = [s for c in recorder.calls for s in c[0].key_position_shift if s]
    assert shifted, "nothing was re-inserted"


# -- Infinity-RoPE -----------------------------------------------------------------------------------


class RelativeRopeReference:
    """Infinity-RoPE's causal_model.py (IR 224-296) with its pipeline (IR causal_inference.py 214-297).

    Per layer: a buffer of W slots; on the first call of a block that overflows it, FIFO
    behind the S sink slots; every key is roped at its slot (0 ..), the queries at
    relative_start_frame: W - b after an eviction, else cs below W, else W - b. kv_flush
    before every block index multiple of ``flush`` (S = 1, as their code): slots 1, 2 <-
    the buffer's last two frames, local_end = 3 frames.
    """

    def __init__(self, window, sink, flush=0):
        self.W, self.S, self.flush = window, sink, flush
        self.state = {}
        self.queries_off_their_slots = 0  # calls of layer 0 whose queries are not at the block's slots

    def expect(self, layer, query_frames, raw):
        st = self.state.setdefault(layer, dict(slots=[], block=None, blocks=0))
        raw_k, raw_v = raw
        cs, b = query_frames[0], len(query_frames)
        rolled = False  # the rolling branch: the first call of a block that overflows the buffer
        if query_frames != st["block"]:
            if self.flush and st["blocks"] and st["blocks"] % self.flush == 0:
                assert self.S == 1 and len(st["slots"]) == self.W, (
                    "their flush assumes a full buffer and one sink frame"
                )
                st["slots"] = st["slots"][:1] + st["slots"][-2:]
            st["block"] = query_frames
            st["blocks"] += 1
            overflow = len(st["slots"]) + b - self.W
            rolled = overflow > 0
            if overflow > 0:
                del st["slots"][self.S : self.S + overflow]
            st["slots"] += [None] * b
        for i, f in enumerate(query_frames):
            st["slots"][len(st["slots"]) - b + i] = (f, _frame(raw_k, i), _frame(raw_v, i))
        if rolled:
            start = self.W - b
        else:
            start = cs if cs < self.W else self.W - b
        self.queries_off_their_slots += layer == 0 and start != len(st["slots"]) - b
        keys = [(f, slot, k, v) for slot, (f, k, v) in enumerate(st["slots"])]
        return [start + i for i in range(b)], keys


@pytest.mark.parametrize(
    "blocks, window, sink, flush",
    [
        ([3] * 22, 6, 1, 0),  # the defaults, 66 frames
        ([3] * 22, 9, 1, 3),  # a flush every 3 blocks (their scene boundaries), W large enough to matter
        ([1] * 30, 5, 2, 0),
        ([2] * 20, 5, 1, 0),  # blocks that do not divide W
    ],
)
def test_relative_rope_follows_the_reference_over_a_long_rollout(blocks, window, sink, flush):
    reference = RelativeRopeReference(window, sink, flush)
    policy, recorder = rollout(
        "relative_rope", blocks, reference, local_attn_frames=window, sink_frames=sink, flush_every_blocks=flush
    )
    assert recorder.max_error < 1e-12
    # Their query start is the block's slots except after a flush (until the cache is full
    # again) and in the later calls of a block that starts below W after an eviction.
    assert (reference.queries_off_their_slots > 0) == (flush > 0 or window % blocks[0] != 0)
    # Positions never grow: every key sits below W, every query below W + b.
    for layers in recorder.calls:
        layout = layers[0]
        assert max(f + s for f, s in zip(layout.key_frames, layout.key_position_shift)) < window
        assert max(layout.query_frames) + layout.query_position_shift < window + len(layout.query_frames)
    assert policy.flushes == (len(blocks) - 1) // flush if flush else policy.flushes == 0


def test_relative_rope_defaults_trace():
    """W 6, S 1, blocks of 3: f0@0, the two previous frames @1..2, the block @3..5."""
    reference = RelativeRopeReference(6, 1)
    _, recorder = rollout("relative_rope", [3] * 8, reference, steps=0, local_attn_frames=6, sink_frames=1)
    traces = [(c[0].key_frames, c[0].query_position_shift, c[0].relative_position_shift) for c in recorder.calls]
    assert traces[:2] == [((0, 1, 2), 0, (0, 0, 0)), ((0, 1, 2, 3, 4, 5), 0, (0,) * 6)]
    for block, (frames, query_shift, relative) in enumerate(traces[2:], start=2):
        cs = 3 * block
        assert frames == (0, cs - 2, cs - 1, cs, cs + 1, cs + 2)
        assert query_shift == 3 - cs
        # Against the queries, the sink sits at cs - 3 (just before the two recent frames).
        assert relative == (cs - 3, 0, 0, 0, 0, 0)


# -- Reward Forcing's EMA sink -----------------------------------------------------------------------


class EmaSinkReference:
    """Reward Forcing's causal_model.py (RwF 142-252), keys and values before RoPE.

    Per layer: a buffer of W slots (label, raw k, raw v). On the first call of a block
    that overflows it: evicted = the slots after the S sink ones (cloned before the
    roll), FIFO, append; if the evicted tokens equal the sink's: sink = a sink + (1 - a)
    evicted, token by token; else the sink's first tokens become the evicted ones. Keys
    roped at their slot, queries at (sink + local_end - q_len) // fsl, their slot.
    """

    def __init__(self, window, sink, decay):
        self.W, self.S, self.a = window, sink, decay
        self.state = {}
        self.blends = self.replacements = 0

    def expect(self, layer, query_frames, raw):
        st = self.state.setdefault(layer, dict(slots=[], block=None))
        raw_k, raw_v = raw
        b = len(query_frames)
        if query_frames != st["block"]:
            st["block"] = query_frames
            overflow = len(st["slots"]) + b - self.W
            evicted = []
            if overflow > 0:
                evicted = st["slots"][self.S : self.S + overflow]
                del st["slots"][self.S : self.S + overflow]
            st["slots"] += [None] * b
            if evicted and len(evicted) == self.S:
                st["slots"][: self.S] = [
                    (label, self.a * k + (1 - self.a) * ek, self.a * v + (1 - self.a) * ev)
                    for (label, k, v), (_, ek, ev) in zip(st["slots"][: self.S], evicted)
                ]
                self.blends += layer == 0
            elif evicted:
                for i, slot in enumerate(evicted[: self.S]):
                    st["slots"][i] = slot
                self.replacements += layer == 0
        for i, f in enumerate(query_frames):
            st["slots"][len(st["slots"]) - b + i] = (f, _frame(raw_k, i), _frame(raw_v, i))
        start = len(st["slots"]) - b
        keys = [(label, slot, k, v) for slot, (label, k, v) in enumerate(st["slots"])]
        return [start + i for i in range(b)], keys


@pytest.mark.parametrize(
    "blocks, window, sink, decay",
    [
        ([3] * 22, 9, 3, EMA_DECAY),  # the defaults, 66 frames
        ([3] * 22, 9, 3, 0.5),  # a decay that moves the sink visibly
        ([1, 3, 3, 3, 3, 3, 3, 3], 9, 3, 0.8),  # independent first frame: one replacement, then blends
        ([1] * 24, 6, 2, 0.7),  # evictions of 1 frame: their replacement branch every time
    ],
)
def test_ema_sink_follows_the_reference_over_a_long_rollout(blocks, window, sink, decay):
    reference = EmaSinkReference(window, sink, decay)
    policy, recorder = rollout(
        "ema_sink", blocks, reference, local_attn_frames=window, sink_frames=sink, ema_decay=decay
    )
    assert recorder.max_error < 1e-12
    assert (policy.blends, policy.replacements) == (reference.blends, reference.replacements)
    assert policy.blends + policy.replacements > 0
    for layers in recorder.calls:
        layout = layers[0]
        assert max(f + s for f, s in zip(layout.key_frames, layout.key_position_shift)) < window


def test_ema_sink_defaults_trace():
    """W 9, S 3, blocks of 3: sink slots labelled 0..2 at 0..2, the previous block at 3..5, the block at 6..8."""
    reference = EmaSinkReference(9, 3, EMA_DECAY)
    _, recorder = rollout("ema_sink", [3] * 8, reference, steps=0, local_attn_frames=9, sink_frames=3)
    for block, layers in enumerate(recorder.calls[3:], start=3):
        layout, cs = layers[0], 3 * block
        assert layout.key_frames == (0, 1, 2, cs - 3, cs - 2, cs - 1, cs, cs + 1, cs + 2)
        assert layout.query_position_shift == 6 - cs
        assert layout.relative_position_shift == (cs - 6,) * 3 + (0,) * 6
    assert reference.blends == 5


def test_ema_sink_in_bfloat16_blends_as_their_code_does():
    """a = 0.999 in the cache dtype: in bf16, a * x rounds back to x, so most sink entries stay."""
    cache = KVCache(
        num_layers=1, batch_size=1, num_heads=2, head_dim=8, frame_seq_length=4, capacity_frames=4, dtype=torch.bfloat16
    )
    policy = EmaSinkPolicy(cache, window_frames=4, sink_frames=1, rope=RotaryTables(head_dim=8))
    g = torch.Generator().manual_seed(0)
    for start in range(5):
        policy.begin_call(start, 1, grid=(2, 2))
        raw = torch.randn(1, 4, 2, 8, generator=g).to(torch.bfloat16)
        if start == 0:
            sink = raw.clone()
        if start == 1:
            evicted = raw.clone()
        policy.attend(0, raw, raw, raw, raw)
    assert policy.blends == 1
    expected = (EMA_DECAY * sink + (1 - EMA_DECAY) * evicted).to(torch.bfloat16)  # bf16 op by op, as theirs
    assert torch.equal(cache.k[0, :, :4], expected)
    # a * x rounds back to x in bf16 (a relative change of 1e-3, below half a bf16 ulp), so
    # an entry moves only where (1 - a) * evicted reaches half an ulp of it.
    assert torch.equal(EMA_DECAY * sink, sink)
    unchanged = (cache.k[0, :, :4] == sink).float().mean()
    assert unchanged > 0.5, "a 0.999 blend in bf16 leaves most entries as they were"


# -- every new policy: options, memory, capture ----------------------------------------------------


NEW = ("rolling_sink", "relative_rope", "ema_sink")


def test_defaults_and_keys_follow_the_references():
    expected = {"rolling_sink": (21, 3), "relative_rope": (6, 1), "ema_sink": (9, 3)}
    for name in NEW:
        options = GenerationOptions.from_config(dict(cache_policy=name, num_frames=60))
        assert (options.local_attn_frames, options.sink_frames) == expected[name]
        assert CACHE_POLICY_TABLE[name].keys == ("local_attn_frames", "sink_frames")
        with pytest.raises(OptionsError, match="generation.sink_frames"):
            GenerationOptions.from_config(dict(cache_policy=name, sink_frames=0))
        with pytest.raises(OptionsError, match="generation.budget_frames"):
            GenerationOptions.from_config(dict(cache_policy=name, budget_frames=4))
    with pytest.raises(OptionsError, match="generation.local_attn_frames"):
        GenerationOptions.from_config(dict(cache_policy="relative_rope", local_attn_frames=3, sink_frames=1))


@pytest.mark.slow
@pytest.mark.parametrize("policy", NEW)
def test_memory_is_bounded_and_estimated(policy):
    """The device memory of the policy does not grow with the video, and the estimate covers it."""
    model = build_model("demo", seed=0)
    context = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(1))
    small = dict(rolling_sink=dict(local_attn_frames=12, sink_frames=3)).get(policy, {})
    sizes = {}
    for frames in (30, 90):
        options = GenerationOptions.from_config(
            dict(cache_policy=policy, num_frames=frames, denoising_steps=[1000], **small)
        )
        result = generate(model, context, options=options, seed=0)
        assert torch.isfinite(result.latents).all()
        sizes[frames] = result.kv_cache_bytes
        config = model.config
        per_frame = config.num_layers * 2 * 24 * config.dim * 4  # K and V, 24 tokens a frame, float32
        assert options.kv_cache_frames * per_frame == result.kv_cache_bytes
    assert sizes[30] == sizes[90]


def test_capture_rows_of_the_new_policies():
    """Rolling Sink rows repeat a key frame at two shifts; relative policies' rows carry the shift
    relative to the queries (the sink moved next to the window, the rest at 0)."""
    model = build_model("demo", seed=0)
    context = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(1))
    configs = {
        "rolling_sink": dict(local_attn_frames=12, sink_frames=3, num_frames=24),
        "relative_rope": dict(num_frames=18),
        "ema_sink": dict(num_frames=18),
    }
    for policy, extra in configs.items():
        options = GenerationOptions.from_config(dict(cache_policy=policy, denoising_steps=[1000, 500], **extra))
        capture = FrameStatsCapture(model, [1], frame_seq_length=24, token_profiles="none")
        with capture:
            generate(model, context, options=options, seed=0, observers=[capture])
        rows = capture.layer_tables()[1]["frames"]
        keys = ["block", "pass", "step", "head", "query_frame"]
        assert np.allclose(rows.groupby(keys, observed=True)["prob_mass"].sum(), 1.0, atol=1e-5)
        last = rows[rows["block"] == rows["block"].max()]
        if policy == "rolling_sink":
            # Block 5 (cs 15) sees frames 6..8 at their own positions and re-inserted at 11, 10, 9.
            repeated = rows.groupby([*keys, "key_frame"], observed=True).size()
            assert (repeated == 2).any() and (repeated <= 2).all()
            assert (rows.groupby([*keys, "key_frame", "key_position_shift"], observed=True).size() == 1).all()
            twice = rows[(rows["block"] == 5) & (rows["head"] == 0) & (rows["query_frame"] == 15) & (rows["step"] == 0)]
            assert sorted(zip(twice["key_frame"], twice["key_position_shift"]))[:6] == [
                (6, 0),
                (6, 5),
                (7, 0),
                (7, 3),
                (8, 0),
                (8, 1),
            ]
        else:
            cs = int(last["query_frame"].min())
            window, sink = options.local_attn_frames, options.sink_frames
            shifts = last.groupby("key_frame")["key_position_shift"].unique()
            # The sink's keys at slots 0 .. S - 1, the queries at W - 3: the sink sits at cs - (W - 3) + i.
            assert all(list(shifts[f]) == [cs - (window - 3)] for f in range(sink))
            assert all(list(shifts[f]) == [0] for f in shifts.index if f >= sink)


def test_layout_refuses_a_frame_twice_at_one_shift():
    from sinkscope.model.layout import AttentionLayout

    AttentionLayout((5,), (1, 1), (FSL, FSL), (0, 3))
    with pytest.raises(ValueError, match="same RoPE shift"):
        AttentionLayout((5,), (1, 1), (FSL, FSL), (3, 3))


def test_tokens_of_the_layout_helper_still_read_whole_frames():
    from sinkscope.model.layout import AttentionLayout

    layout = AttentionLayout.whole_frames((4,), (0, 0, 4), FSL, shifts=(0, 2, 0), query_shift=-1)
    assert layout.relative_position_shift == (1, 3, 1)
    assert len(layout_tokens(layout)) == 3 * FSL


def test_compiled_blocks_take_the_keys_before_rope_on_every_call():
    """Cache-relative policies run the compiled attention inputs with rope_k=False (dynamo, eager backend)."""

    def video(compiled):
        model = tiny_model()
        if compiled:
            model.compile_blocks(backend="eager")
        policy = new_policy(model, "relative_rope", frame_seq_length=FSL, local_attn_frames=6, sink_frames=1)
        g = torch.Generator().manual_seed(0)
        context = torch.randn(1, 5, TINY.text_dim, generator=g, dtype=torch.float64)
        outs = []
        for block in range(4):
            for t in (1000.0, 0.0):
                x = torch.randn(
                    1, TINY.in_dim, 3, TINY.latent_height, TINY.latent_width, generator=g, dtype=torch.float64
                )
                outs.append(model(x, t, context, cache_policy=policy, start_frame=3 * block))
        return torch.cat(outs, dim=2)

    torch.testing.assert_close(video(True), video(False), rtol=1e-12, atol=1e-12)
