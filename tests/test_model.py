"""The transformer: KV-cache block steps equal the block-causal full forward."""

from __future__ import annotations

import pytest
import torch

from sinkscope.generation.sampler import block_causal_frame_mask
from sinkscope.model import KVCache, WanConfig, build_model, get_model_config
from sinkscope.model.policies import GlobalPolicy, SinkPolicy, new_policy
from sinkscope.model.wan import RotaryTables, apply_rope, sinusoidal_embedding

TINY = WanConfig(
    dim=48, ffn_dim=64, num_heads=4, num_layers=2, text_dim=16, text_len=8, freq_dim=16, latent_height=4, latent_width=6
)


def tiny_model(dtype=torch.float64):
    return build_model(TINY, seed=3, dtype=dtype)


def run_cached(model, x, timesteps, context, block_sizes, *, window=-1, sinks=0):
    """Feed each block once through a KV cache at its own timestep; return all outputs."""
    fsl = TINY.frame_seq_length(x.shape[3], x.shape[4]) // 1
    policy = "global" if window == -1 else ("sink" if sinks else "window")
    cache = new_policy(
        model,
        policy,
        frame_seq_length=fsl,
        num_frames=x.shape[2],
        local_attn_frames=window,
        sink_frames=sinks,
        batch_size=x.shape[0],
    )
    outs, start = [], 0
    for size in block_sizes:
        block = x[:, :, start : start + size]
        outs.append(model(block, timesteps[:, start : start + size], context, cache_policy=cache, start_frame=start))
        start += size
    return torch.cat(outs, dim=2), cache


@pytest.mark.parametrize(
    "block_sizes, window, sinks",
    [
        ([2, 2, 2], -1, 0),  # global attention, blocks of 2
        ([1, 2, 2, 2], -1, 0),  # independent first frame
        ([2, 2, 2, 2, 2], 5, 1),  # rolling window of 5 frames with 1 sink frame
        ([2, 2, 2, 2], 4, 0),  # rolling window, no sink
    ],
)
def test_kv_cache_steps_equal_block_causal_forward(block_sizes, window, sinks):
    torch.manual_seed(0)
    model = tiny_model()
    frames = sum(block_sizes)
    x = torch.randn(1, TINY.in_dim, frames, 4, 6, dtype=torch.float64)
    # Per-block timesteps, as the cache pass of earlier blocks and the current step mix.
    t = torch.cat([torch.full((size,), float(100 + 150 * i)) for i, size in enumerate(block_sizes)])[None]
    context = torch.randn(1, 5, TINY.text_dim, dtype=torch.float64)
    mask = block_causal_frame_mask(block_sizes, window, sinks)
    full = model(x, t, context, frame_mask=mask)
    cached, cache = run_cached(model, x, t, context, block_sizes, window=window, sinks=sinks)
    torch.testing.assert_close(cached, full, rtol=1e-9, atol=1e-9)
    expected_keys = [f for f in range(frames) if mask[-1, f]]
    assert cache.key_frames == expected_keys


def test_repeated_calls_overwrite_the_block():
    """Denoising steps of the same block do not grow the cache; the last write wins."""
    model = tiny_model()
    x = torch.randn(1, TINY.in_dim, 4, 4, 6, dtype=torch.float64)
    context = torch.randn(1, 5, TINY.text_dim, dtype=torch.float64)
    cache = new_policy(model, "global", frame_seq_length=6, num_frames=4)
    model(x[:, :, :2], 900.0, context, cache_policy=cache, start_frame=0)
    model(x[:, :, :2], 500.0, context, cache_policy=cache, start_frame=0)
    model(x[:, :, :2], 0.0, context, cache_policy=cache, start_frame=0)
    assert cache.key_frames == [0, 1]
    out_cached = model(x[:, :, 2:], 700.0, context, cache_policy=cache, start_frame=2)
    t = torch.tensor([[0.0, 0.0, 700.0, 700.0]], dtype=torch.float64)
    full = model(x, t, context, frame_mask=block_causal_frame_mask([2, 2]))
    torch.testing.assert_close(out_cached, full[:, :, 2:], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("observe_last_layer", [False, True])
def test_a_cache_only_pass_stores_the_same_keys_and_skips_the_rest(observe_last_layer):
    """Self-Forcing's cache pass with cache_only: every layer's cache as the full pass leaves
    it; the last layer's observer (a captured layer) still sees its call; nothing returned."""
    model = tiny_model()
    x = torch.randn(1, TINY.in_dim, 4, 4, 6, dtype=torch.float64)
    context = torch.randn(1, 5, TINY.text_dim, dtype=torch.float64)
    seen = []
    if observe_last_layer:
        model.set_observer(TINY.num_layers - 1, lambda q, k, v, layout: seen.append(k.shape[1]))
    caches = []
    for cache_only in (False, True):
        cache = new_policy(model, "global", frame_seq_length=6, num_frames=4)
        model(x[:, :, :2], 900.0, context, cache_policy=cache, start_frame=0)
        result = model(x[:, :, :2], 0.0, None, cache_policy=cache, start_frame=0, cache_only=cache_only)
        assert (result is None) == cache_only
        caches.append(cache.cache)
    full, short = caches
    assert full.lengths == short.lengths
    assert torch.equal(full.k, short.k) and torch.equal(full.v, short.v)
    assert seen == ([12, 12, 12, 12] if observe_last_layer else [])


def test_feed_forward_off_cuda_is_the_modules_own():
    from sinkscope.model.wan import feed_forward

    model = tiny_model(torch.float32)
    h = torch.randn(1, 10, TINY.dim)
    with torch.no_grad():
        assert torch.equal(feed_forward(model.blocks[0].ffn, h), model.blocks[0].ffn(h))


def test_cache_rejects_out_of_order_blocks_and_overflow():
    cache = GlobalPolicy(
        KVCache(num_layers=1, batch_size=1, num_heads=1, head_dim=6, frame_seq_length=2, capacity_frames=4)
    )
    cache.begin_call(0, 2)
    with pytest.raises(ValueError, match="next block must start at frame 2"):
        cache.begin_call(3, 2)
    cache.begin_call(2, 2)
    with pytest.raises(ValueError, match="is full at frame 4"):
        cache.begin_call(4, 2)
    rolling = SinkPolicy(
        KVCache(num_layers=1, batch_size=1, num_heads=1, head_dim=6, frame_seq_length=2, capacity_frames=4),
        window_frames=4,
        sink_frames=2,
    )
    rolling.begin_call(0, 2)
    rolling.begin_call(2, 2)
    rolling.begin_call(4, 2)
    assert rolling.key_frames == [0, 1, 4, 5]
    with pytest.raises(ValueError, match="cannot hold a block of 3"):
        rolling.begin_call(6, 3)


def test_rolling_keeps_sink_keys_in_place():
    cache = SinkPolicy(
        KVCache(num_layers=2, batch_size=1, num_heads=1, head_dim=6, frame_seq_length=1, capacity_frames=3),
        window_frames=3,
        sink_frames=1,
    )
    for frame in range(5):
        cache.begin_call(frame, 1)
        value = torch.full((1, 1, 1, 6), float(frame))
        k, _ = cache.attend(0, value, value, value)
    # Slots hold frames [0, 3, 4]: the sink never moved, the rest shifted left.
    assert cache.key_frames == [0, 3, 4]
    assert k[0, :, 0, 0].tolist() == [0.0, 3.0, 4.0]


def test_rope_matches_complex_multiplication_in_float64():
    tables = RotaryTables(head_dim=12)
    phases = tables.phases(5, 2, 3, 4, torch.device("cpu"), torch.float64)
    x = torch.randn(1, 24, 2, 12, dtype=torch.float64)
    rotated = apply_rope(x, phases)
    # Reference: Wan's complex form, angles pos * 10000^(-2j/d_axis) per axis.
    d = 12
    axes = (d - 4 * (d // 6), 2 * (d // 6), 2 * (d // 6))
    f, h, w = torch.meshgrid(torch.arange(5, 7), torch.arange(3), torch.arange(4), indexing="ij")
    angles = []
    for positions, dim in zip((f, h, w), axes):
        inv = 1.0 / 10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        angles.append(positions.reshape(-1, 1).double() * inv)
    phase = torch.polar(torch.ones(24, d // 2, dtype=torch.float64), torch.cat(angles, dim=1))
    expected = torch.view_as_real(torch.view_as_complex(x.reshape(1, 24, 2, -1, 2)) * phase[None, :, None]).flatten(3)
    torch.testing.assert_close(rotated, expected, rtol=1e-12, atol=1e-12)


def test_rope_positions_past_the_models_table_follow_the_same_formula():
    """Rollouts past 1024 latent frames: positions beyond the model's table are computed,
    not refused, and agree with a table large enough to hold them."""
    small, large = RotaryTables(head_dim=12, max_positions=8), RotaryTables(head_dim=12, max_positions=4096)
    for start in (6, 1500, 4000):
        torch.testing.assert_close(
            small.phases(start, 3, 2, 2, torch.device("cpu"), torch.float64),
            large.phases(start, 3, 2, 2, torch.device("cpu"), torch.float64),
            rtol=0,
            atol=0,
        )
    with pytest.raises(ValueError, match="negative"):
        small.phases(-1, 2, 2, 2, torch.device("cpu"), torch.float64)


def test_a_rollout_runs_past_the_models_rope_table():
    import dataclasses

    from sinkscope.generation.sampler import generate
    from sinkscope.model.wan import WanModel, init_random_weights
    from sinkscope.options import GenerationOptions

    config = dataclasses.replace(get_model_config("demo"), rope_max_positions=6, num_layers=1)
    model = WanModel(config)
    init_random_weights(model, 0)
    options = GenerationOptions.from_config(
        {"num_frames": 12, "cache_policy": "sink", "local_attn_frames": 6, "sink_frames": 3, "denoising_steps": [1000]}
    )
    result = generate(model, torch.randn(1, 7, config.text_dim), options=options, seed=0)
    assert result.latents.shape[2] == 12 and torch.isfinite(result.latents).all()


def test_sinusoidal_embedding_is_cos_first():
    emb = sinusoidal_embedding(8, torch.tensor([0.0, 2.0]))
    assert emb.dtype == torch.float64
    assert emb[0].tolist() == [1.0] * 4 + [0.0] * 4
    torch.testing.assert_close(emb[1, 0], torch.cos(torch.tensor(2.0, dtype=torch.float64)))


def test_state_dict_uses_original_wan_names():
    model = build_model("demo", seed=0)
    keys = set(model.state_dict())
    for name in (
        "patch_embedding.weight",
        "text_embedding.0.weight",
        "text_embedding.2.bias",
        "time_embedding.0.weight",
        "time_projection.1.weight",
        "blocks.0.modulation",
        "blocks.0.self_attn.q.weight",
        "blocks.0.self_attn.norm_k.weight",
        "blocks.0.norm3.weight",
        "blocks.0.cross_attn.o.bias",
        "blocks.5.ffn.2.weight",
        "head.modulation",
        "head.head.weight",
    ):
        assert name in keys
    # Non-affine norms have no keys; 27 tensors a block plus 15 others, as the real release.
    assert not any(k.startswith(("blocks.0.norm1", "blocks.0.norm2", "head.norm")) for k in keys)
    assert len(keys) == 27 * model.config.num_layers + 15


def test_real_config_sizes():
    config = get_model_config("wan2.1-t2v-1.3b")
    assert config.frame_seq_length() == 1560
    assert config.head_dim == 128
    model = torch.device("meta")
    with model:
        from sinkscope.model import WanModel

        meta = WanModel(config)
    assert sum(p.numel() for p in meta.parameters()) == 1_418_996_800


def test_seeded_weights_are_reproducible_and_seed_dependent():
    a = build_model("demo", seed=1).state_dict()
    b = build_model("demo", seed=1).state_dict()
    c = build_model("demo", seed=2).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["blocks.0.self_attn.q.weight"], c["blocks.0.self_attn.q.weight"])


def gelu_epilogue_gaps(device: str = "cuda") -> tuple[float, float]:
    """Mean |GELU epilogue - tanh GELU| and |... - erf GELU| at x in [-4, -2], where the forms
    differ by about 10% (x = -3: -0.00364 against -0.00405) and bf16 resolves it."""
    x = torch.linspace(-4, -2, 256, device=device).bfloat16().reshape(16, 16)
    eye, zero = torch.eye(16, device=device).bfloat16(), torch.zeros(16, device=device).bfloat16()
    fused = torch._addmm_activation(zero, x, eye, use_gelu=True).float()
    tanh = torch.nn.functional.gelu(x.float(), approximate="tanh").bfloat16().float()
    erf = torch.nn.functional.gelu(x.float()).bfloat16().float()
    return (fused - tanh).abs().mean().item(), (fused - erf).abs().mean().item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_ffn_gelu_epilogue_is_the_tanh_gelu_rounded_once():
    from sinkscope.model.wan import feed_forward

    tanh_gap, erf_gap = gelu_epilogue_gaps()
    assert tanh_gap < erf_gap / 10
    g = torch.Generator(device="cuda").manual_seed(0)
    ffn = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(1024, 256))
    ffn = ffn.cuda().bfloat16()
    h = (torch.randn(1, 300, 256, device="cuda", generator=g) * 3).bfloat16()
    with torch.no_grad():
        fused, composed = feed_forward(ffn, h), ffn(h)
    torch.testing.assert_close(fused.float(), composed.float(), atol=0.06, rtol=0.02)
