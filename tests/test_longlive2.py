"""LongLive 2.0 on Wan2.2-TI2V-5B (``procedure: longlive2``, ``cache_policy: longlive2``).

Tiny random models of the 5B's kind (48 latent channels, 2 layers, 2 heads of 32) run the
real procedure in float64. Every call's keys, values, queries and RoPE positions are
checked against a brute force written here from the fact sheet
(/work/shared/reference/longlive2-and-krea14b.md, section 1.4: LongLive's token buffer,
its roll, the global sink and the pinned shot sink), with an independent float64 RoPE; a
second run returns a plain float64 softmax over exactly those keys from every call and
must give the same video (no mask, no bias). The sampler's use (a new UniPC sampler a
chunk, one noise draw), the NVFP4 cache against ``quantize_cache``, the weight layouts of
``model_bf16.pt`` and a rank-128 LoRA on every Linear of the block are checked too.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from test_policies import rope_reference

from sinkscope.errors import ConfigError
from sinkscope.generation.longlive2 import SCENE_CUT_PREFIX, scene_cuts
from sinkscope.generation.sampler import generate
from sinkscope.generation.unipc import UniPCFlowSampler, flow_unipc_schedule
from sinkscope.model import MODEL_CONFIGS, WanConfig, build_model
from sinkscope.model.checkpoints import CheckpointSpec, resolve_checkpoint
from sinkscope.model.config import parameter_shapes
from sinkscope.model.formats import config_in_folder
from sinkscope.model.loading import load_checkpoint
from sinkscope.model.policies.longlive2 import KV_QUANT_FORMAT, LongLive2Policy
from sinkscope.model.quantize import quantize_cache, smooth_keys
from sinkscope.model.wan import RotaryTables, apply_rope
from sinkscope.options import GenerationOptions, OptionsError, unipc_timesteps

# The 5B's kind, tiny: 48 latent channels in and out, head_dim 32 (NVFP4 blocks of 16), 4 x 6 latents.
TINY5B = WanConfig(
    dim=64,
    ffn_dim=96,
    num_heads=2,
    num_layers=2,
    in_dim=48,
    out_dim=48,
    text_dim=16,
    text_len=8,
    freq_dim=16,
    latent_height=4,
    latent_width=6,
)
FSL = TINY5B.frame_seq_length()  # 6 tokens a frame: a 2 x 3 patch grid
GRID_W = TINY5B.latent_width // 2
STEPS = [999, 937, 833, 624]
SHORT = [999, 833]  # 2 UniPC steps: the trace tests' calls, fewer of them
OFFSET = 8  # their multi_shot_rope_offset


def tiny5b(dtype=torch.float64):
    return build_model(TINY5B, seed=5, dtype=dtype)


def ll2_options(**kw) -> GenerationOptions:
    return GenerationOptions.from_config({"procedure": "longlive2", "denoising_steps": STEPS, "re_cache": False, **kw})


def contexts(count: int, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 5, TINY5B.text_dim, generator=g, dtype=torch.float64) for _ in range(count)]


# -- the 5B model ---------------------------------------------------------------------------


def test_the_5b_config_and_its_block():
    config = MODEL_CONFIGS["wan2.2-ti2v-5b"]
    assert (config.num_layers, config.dim, config.num_heads, config.head_dim, config.ffn_dim) == (
        30,
        3072,
        24,
        128,
        14336,
    )
    assert (config.in_dim, config.out_dim, config.patch_size) == (48, 48, (1, 2, 2))
    assert (config.latent_height, config.latent_width, config.frame_seq_length()) == (44, 80, 880)  # 704 x 1280
    # Their split (L causal_model.py:96, 1074-1081): 44/42/42 real dims of head_dim 128.
    assert RotaryTables(config.head_dim).axis_dims == (44, 42, 42)
    shapes = parameter_shapes(config)
    assert shapes["patch_embedding.weight"] == (3072, 48, 1, 2, 2) and shapes["head.head.weight"] == (4 * 48, 3072)
    assert 4.9e9 < sum(math.prod(s) for s in shapes.values()) < 5.1e9


def test_a_ti2v_config_json_gives_the_named_grid(tmp_path):
    data = {
        "_class_name": "WanModel",
        "dim": 3072,
        "eps": 1e-6,
        "ffn_dim": 14336,
        "freq_dim": 256,
        "in_dim": 48,
        "model_type": "ti2v",
        "num_heads": 24,
        "num_layers": 30,
        "out_dim": 48,
        "text_len": 512,
    }
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert config_in_folder(tmp_path) == MODEL_CONFIGS["wan2.2-ti2v-5b"]


# -- options --------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("shift", [1.0, 3.0, 5.0, 8.0])
def test_the_torch_free_timesteps_equal_the_samplers(steps, shift):
    assert unipc_timesteps(steps, shift) == tuple(flow_unipc_schedule(steps, shift)[0].tolist())


def test_the_procedure_brings_its_policy_and_refuses_what_it_has_no_reference_for():
    options = ll2_options(num_frames=128, frames_per_block=8)
    assert (options.cache_policy, options.local_attn_frames, options.sink_frames) == ("longlive2", 32, 8)
    assert options.num_calls == 16 * 5 and options.cache_capacity_frames == 32
    assert "kv_quant" not in options.to_dict() and "use_relative_rope" not in options.to_dict()
    assert ll2_options(num_frames=16, frames_per_block=8, kv_quant=True).to_dict()["kv_quant"] is True
    refused = [
        (
            dict(denoising_steps=[1000, 750, 500, 250]),
            "generation.denoising_steps: [1000, 750, 500, 250] are not the UniPC",
        ),
        (dict(independent_first_frame=True, num_frames=17), "generation.independent_first_frame"),
        (dict(cache_policy="sink"), "generation.cache_policy: 'sink' cannot run under procedure 'longlive2'"),
    ]
    for extra, message in refused:
        with pytest.raises(OptionsError, match=message.replace("[", r"\[").replace("]", r"\]")):
            ll2_options(**{"num_frames": 16, "frames_per_block": 8, **extra})
    for key in ("kv_quant", "use_relative_rope"):
        with pytest.raises(OptionsError, match=f"generation.{key}: has no meaning for cache_policy 'sink'"):
            GenerationOptions.from_config({"cache_policy": "sink", key: True})


def test_scene_cuts_follow_their_per_chunk_prompt_rule():
    cut, plain = SCENE_CUT_PREFIX + "a boat", "a boat"
    starts = [0, 2, 4, 6]
    assert scene_cuts(starts, [0], [cut]) == [False] * 4  # one prompt: never
    assert scene_cuts(starts, [0, 4], [cut, plain]) == [False, True, False, False]  # chunk 0 never counts
    assert scene_cuts(starts, [0, 2, 4], [plain, cut, plain]) == [False, True, False, False]
    assert scene_cuts(starts, [0, 2], [plain, cut]) == [False, True, True, True]  # every chunk whose prompt has it
    assert scene_cuts(starts, [0, 2], [plain, None]) == [False] * 4  # no text, no cut
    assert scene_cuts(starts, [0, 2], [plain, "the scene transitions. x"]) == [False] * 4  # their prefix exactly


# -- the brute force of the fact sheet's cache -----------------------------------------------


def expected_trace(chunks, frames, window, sink, cuts, *, relative=False, calls=len(SHORT) + 1):  # noqa: B008 (an int, fixed by SHORT)
    """Per model call: (query frames, query position of the first, [(key frame, position)]).

    LongLive's buffer, slot by slot: a chunk's first call rolls when the buffer would
    overflow (evicting behind the protected prefix: the global sink, plus the pin when it
    sits right after it; a pin elsewhere follows the shift); after the clean pass of a
    scene-cut chunk, its first min(sink, chunk) frames are pinned. Positions: frame + 8 x
    shot, or (relative) the slot, the queries at the last slots."""
    buffer, pin, shot, out = [], None, 0, []
    for chunk in range(chunks):
        start = chunk * frames
        if cuts[chunk]:
            shot += 1
        if len(buffer) + frames > window:
            evicted = len(buffer) + frames - window
            protected = sink + pin[1] if pin is not None and pin[0] == sink else sink
            buffer = buffer[:protected] + buffer[protected + evicted :]
            if pin is not None and pin[0] >= protected:
                pin = (pin[0] - evicted, pin[1])
        buffer += [(f, shot) for f in range(start, start + frames)]
        if relative:
            keys = [(f, slot) for slot, (f, _) in enumerate(buffer)]
            query = len(buffer) - frames
        else:
            keys = [(f, f + OFFSET * s) for f, s in buffer]
            query = start + OFFSET * shot
        out += [(tuple(range(start, start + frames)), query, keys)] * calls
        if cuts[chunk]:
            pin = (len(buffer) - frames, min(sink, frames))
    return out


class Brute:
    """Records what each layer produced (q, k before RoPE, v) and checks every call's softmax
    inputs against the trace; with ``answer``, returns a float64 softmax over them."""

    def __init__(self, model, trace, answer=False):
        self.trace, self.answer = trace, answer
        self.raw_k = [dict() for _ in model.blocks]
        self.raw_v = [dict() for _ in model.blocks]
        self.pending = {}
        self.calls = 0
        for layer, block in enumerate(model.blocks):
            attn, project = block.self_attn, block.self_attn.project

            def recording(h, layer=layer, project=project):
                q, k, v = project(h)
                self.pending[layer] = (q.clone(), k.clone(), v.clone())
                return q, k, v

            attn.project = recording
            attn.observer = lambda q, k, v, layout, layer=layer: self.observe(layer, q, k, v, layout)

    def observe(self, layer, q, k, v, layout):
        raw_q, raw_k, raw_v = self.pending.pop(layer)
        query_frames, query_position, keys = self.trace[self.calls]
        for i, frame in enumerate(query_frames):
            self.raw_k[layer][frame] = raw_k[:, i * FSL : (i + 1) * FSL]
            self.raw_v[layer][frame] = raw_v[:, i * FSL : (i + 1) * FSL]
        if layer == len(self.raw_k) - 1:
            self.calls += 1
        # The layout names the trace's frames at the trace's positions (relative to the queries').
        assert layout.query_frames == query_frames and layout.key_token_index is None
        assert list(zip(layout.key_frames, layout.relative_position_shift)) == [
            (f, p - f - (query_position - query_frames[0])) for f, p in keys
        ]
        tokens = np.arange(FSL)
        expected_q = rope_reference(
            raw_q,
            np.repeat(np.arange(len(query_frames)) + query_position, FSL),
            np.tile(tokens // GRID_W, len(query_frames)),
            np.tile(tokens % GRID_W, len(query_frames)),
        )
        expected_k = torch.cat(
            [rope_reference(self.raw_k[layer][f], np.full(FSL, p), tokens // GRID_W, tokens % GRID_W) for f, p in keys],
            dim=1,
        )
        expected_v = torch.cat([self.raw_v[layer][f] for f, _ in keys], dim=1)
        torch.testing.assert_close(q, expected_q, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(k, expected_k, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(v, expected_v, rtol=0, atol=0)
        if not self.answer:
            return None
        scores = torch.einsum("bqhd,bkhd->bhqk", expected_q, expected_k) / math.sqrt(q.shape[-1])
        return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), expected_v).to(q.dtype)


SHOTS = {
    # chunks of 2, window 8, sink 2: a cut floats down to the global sink, stays, is replaced.
    "chunks2": (
        2,
        8,
        2,
        [
            (0, "a fox"),
            (10, SCENE_CUT_PREFIX + "a boat"),
            (12, "a boat"),
            (16, SCENE_CUT_PREFIX + "a city"),
            (18, "a city"),
        ],
        10,
    ),
    # chunks of 4 longer than the sink: only the chunk's first 2 frames are pinned.
    "chunks4": (
        4,
        12,
        2,
        [(0, "a fox"), (8, SCENE_CUT_PREFIX + "a boat"), (12, "a boat"), (16, SCENE_CUT_PREFIX + "a city")],
        6,
    ),
}


def run_longlive2(case, *, relative=False, answer=False, kv_quant=False, seed=0):
    frames, window, sink, segments, chunks = SHOTS[case]
    model = tiny5b()
    options = ll2_options(
        num_frames=frames * chunks,
        frames_per_block=frames,
        local_attn_frames=window,
        sink_frames=sink,
        use_relative_rope=relative,
        kv_quant=kv_quant,
        denoising_steps=SHORT,
    )
    ctx = contexts(len(segments))
    schedule = [(start, c, text) for (start, text), c in zip(segments, ctx)]
    cuts = scene_cuts(options.block_starts(), [s for s, _ in segments], [t for _, t in segments])
    trace = expected_trace(chunks, frames, window, sink, cuts, relative=relative)
    brute = Brute(model, trace, answer=answer) if not kv_quant else None
    result = generate(model, schedule, options=options, seed=seed)
    return result, brute, trace, cuts, model


@pytest.mark.parametrize("case", list(SHOTS))
@pytest.mark.parametrize("relative", [False, True])
def test_every_call_sees_the_brute_forces_keys_at_its_positions(case, relative):
    result, brute, trace, cuts, _ = run_longlive2(case, relative=relative)
    assert brute.calls == len(trace) == len(result.calls)
    assert sum(cuts) == {"chunks2": 2, "chunks4": 3}[case]  # chunks4: a cut right after a cut
    # The trace covers what the fact sheet describes: a floating pin, one kept with the global
    # sink, a second cut replacing it, and RoPE positions past the frames (the shot offset).
    if case == "chunks2" and not relative:
        frames_at = [[f for f, _ in trace[chunk * 3][2]] for chunk in range(10)]
        assert frames_at[5] == [0, 1, 6, 7, 8, 9, 10, 11]  # the first cut's chunk, pinned after it
        assert frames_at[7] == [0, 1, 10, 11, 12, 13, 14, 15]  # the pin floated down to the global sink
        assert frames_at[8] == [0, 1, 10, 11, 14, 15, 16, 17]  # kept with it: 12, 13 went
        assert frames_at[9] == [0, 1, 14, 15, 16, 17, 18, 19]  # the second cut replaced it
        assert trace[-1][1] == 18 + 2 * OFFSET


@pytest.mark.parametrize("relative", [False, True])
def test_a_plain_softmax_over_those_keys_gives_the_same_video(relative):
    """The model's attention over what its cache hands the softmax is a plain softmax over the
    brute force's keys and values: no mask, no bias (their attention, fact sheet 1.4 f)."""
    own, _, _, _, _ = run_longlive2("chunks4", relative=relative)
    brute, _, _, _, _ = run_longlive2("chunks4", relative=relative, answer=True)
    torch.testing.assert_close(own.latents, brute.latents, rtol=1e-9, atol=1e-9)


def test_chunks_run_a_new_unipc_sampler_on_one_noise_draw():
    """Each chunk: the calls at t = 999, 937, 833, 624 on the samples a fresh UniPC sampler
    gives from the chunk's slice of one seeded CPU draw, then the clean pass at t = 0 on its
    output, which is the chunk's latents."""
    frames, chunks, seed = 2, 3, 7
    model = tiny5b()
    calls = []
    model.register_forward_hook(
        lambda m, args, kwargs, out: calls.append((args[0].clone(), args[1].clone(), out)), with_kwargs=True
    )
    options = ll2_options(num_frames=frames * chunks, frames_per_block=frames, local_attn_frames=8, sink_frames=2)
    result = generate(model, contexts(1)[0], options=options, seed=seed)
    noise = torch.randn((frames * chunks, 48, 4, 6), generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    assert [c.pass_ for c in result.calls] == (["denoise"] * 4 + ["cache"]) * chunks
    assert [c.timestep for c in result.calls] == [999.0, 937.0, 833.0, 624.0, 0.0] * chunks
    for chunk in range(chunks):
        sampler = UniPCFlowSampler(4, 5.0)
        x = noise[chunk * frames : (chunk + 1) * frames].permute(1, 0, 2, 3)[None].double()
        for step in range(4):
            given, t, velocity = calls[chunk * 5 + step]
            assert torch.equal(given, x) and torch.all(t == float(STEPS[step])) and t.dtype == torch.float32
            x = sampler.step(velocity, x)
        given, t, out = calls[chunk * 5 + 4]
        assert torch.equal(given, x) and torch.all(t == 0) and out is None
        assert torch.equal(result.latents[:, :, chunk * frames : (chunk + 1) * frames], x)


@pytest.mark.parametrize("relative", [False, True])
def test_kv_quant_caches_the_quantize_cache_roundtrip_and_centres_the_current_keys(relative):
    """Earlier chunks: the clean pass's stored keys (roped, or before RoPE when relative) and
    values as quantize_cache(nvfp4_4over6) returns them, one chunk of one layer at a time;
    the current chunk's keys mean-centred over head_dim, not quantized (their k_smooth)."""
    frames, window, sink, chunks = 2, 8, 2, 6
    model = tiny5b()
    options = ll2_options(
        num_frames=frames * chunks,
        frames_per_block=frames,
        local_attn_frames=window,
        sink_frames=sink,
        use_relative_rope=relative,
        kv_quant=True,
    )
    stored, seen = {}, []
    for layer, block in enumerate(model.blocks):
        attn, project = block.self_attn, block.self_attn.project

        def recording(h, layer=layer, project=project):
            q, k, v = project(h)
            stored[layer] = (k.clone(), v.clone())
            return q, k, v

        attn.project = recording
        attn.observer = lambda q, k, v, layout, layer=layer: seen.append(
            (layer, k.clone(), v.clone(), layout, stored[layer])
        )
    generate(model, contexts(1)[0], options=options, seed=0)
    rope = model.rope
    clean = {}  # (layer, chunk) -> the clean pass's stored k (roped unless relative) and v
    for index, (layer, k, v, layout, (raw_k, raw_v)) in enumerate(seen):
        call, chunk = index // 2, index // 2 // 5
        start = chunk * frames
        position = layout.query_position_shift + start
        roped = raw_k if relative else apply_rope(raw_k, rope.phases(position, frames, 2, 3, k.device, torch.float64))
        if call % 5 == 4:
            clean[layer, chunk] = quantize_cache(roped, raw_v, KV_QUANT_FORMAT, "both")
        earlier = [clean[layer, f // frames] for f in layout.key_frames[:-frames:frames]]
        expected_k = torch.cat([*(e[0] for e in earlier), smooth_keys(roped)], dim=1)
        expected_v = torch.cat([*(e[1] for e in earlier), raw_v], dim=1)
        if relative:
            expected_k = apply_rope(expected_k, rope.phases(0, len(layout.key_frames), 2, 3, k.device, torch.float64))
        assert torch.equal(k, expected_k) and torch.equal(v, expected_v), (call, layer)
    assert len(seen) == 2 * 5 * chunks and any(not torch.equal(e[0], smooth_keys(e[0])) for e in clean.values())


def test_the_policy_refuses_what_their_cache_cannot_hold():
    model = tiny5b()
    from sinkscope.model.policies import new_policy

    with pytest.raises(ValueError, match="1 <= sink_frames < window_frames"):
        new_policy(model, "longlive2", frame_seq_length=FSL, local_attn_frames=4, sink_frames=4)
    policy = new_policy(model, "longlive2", frame_seq_length=FSL, local_attn_frames=8, sink_frames=2)
    assert isinstance(policy, LongLive2Policy) and policy.cache.capacity_frames == 8
    with pytest.raises(ValueError, match="cannot re-cache"):
        policy.begin_call(0, 2, grid=(2, 3))
        policy.begin_recache(0, 2)


# -- weights: model_bf16.pt's layouts and LongLive's LoRA ------------------------------------


def write_base(folder, config=TINY5B):
    """A Wan2.2-TI2V-5B-like folder's config.json (model_type ti2v), sized as ``config``."""
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "_class_name": "WanModel",
        "model_type": "ti2v",
        "dim": config.dim,
        "ffn_dim": config.ffn_dim,
        "freq_dim": config.freq_dim,
        "in_dim": config.in_dim,
        "num_heads": config.num_heads,
        "num_layers": config.num_layers,
        "out_dim": config.out_dim,
        "text_len": config.text_len,
        "text_dim": config.text_dim,
        "eps": config.eps,
    }
    (folder / "config.json").write_text(json.dumps(data))
    return folder


def tiny_state(seed):
    return {k: v.clone() for k, v in build_model(TINY5B, seed=seed).state_dict().items()}


@pytest.mark.parametrize(
    "layout, ema", [("generator", False), ("generator_ema", True), ("model", False), ("model", True)]
)
def test_model_bf16_pt_layouts_load(tmp_path, layout, ema):
    """{generator: {model.<keys>}}, {generator_ema: {model._fsdp_wrapped_module.<keys>}} (their
    EMA names) or {model: {model.<keys>}} (L utils/nvfp4_checkpoint.py:38-52)."""
    state = tiny_state(11)
    prefix = "model._fsdp_wrapped_module." if layout == "generator_ema" else "model."
    data = {layout: {f"{prefix}{k}": v.to(torch.bfloat16) for k, v in state.items()}, "step": 100}
    torch.save(data, tmp_path / "model_bf16.pt")
    spec = CheckpointSpec(name="ll2", format="self_forcing", weights="model_bf16.pt", base="base", ema=ema)
    write_base(tmp_path / "base")
    resolved = resolve_checkpoint(spec, tmp_path)
    assert (
        dataclasses.replace(resolved.model_config, latent_height=4, latent_width=6) == TINY5B
    )  # the grid is the run's
    model = load_checkpoint(resolved, device=torch.device("cpu"))
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key].to(torch.bfloat16).float()), key


def test_the_ema_switch_names_the_entry_the_file_lacks(tmp_path):
    torch.save({"generator": {f"model.{k}": v for k, v in tiny_state(11).items()}}, tmp_path / "model_bf16.pt")
    write_base(tmp_path / "base")
    spec = CheckpointSpec(name="ll2", format="self_forcing", weights="model_bf16.pt", base="base", ema=True)
    with pytest.raises(ConfigError, match="has no 'generator_ema'.*set ema: false"):
        resolve_checkpoint(spec, tmp_path)


def test_a_rank_128_lora_on_every_linear_of_the_block_merges(tmp_path):
    """LongLive's PEFT LoraConfig(r=128, alpha=128) on every nn.Linear of the block (self and
    cross q, k, v, o; ffn.0, ffn.2) under generator_lora: W + (alpha / r) B A, alpha = r."""
    state = tiny_state(12)
    torch.save({"generator": {f"model.{k}": v for k, v in state.items()}}, tmp_path / "model.pt")
    write_base(tmp_path / "base")
    g = torch.Generator().manual_seed(3)
    adapter, modules = {}, []
    for layer in range(TINY5B.num_layers):
        for name in [f"{a}.{p}" for a in ("self_attn", "cross_attn") for p in "qkvo"] + ["ffn.0", "ffn.2"]:
            module = f"blocks.{layer}.{name}"
            out_dim, in_dim = state[f"{module}.weight"].shape
            adapter[f"base_model.model.{module}.lora_A.weight"] = 0.01 * torch.randn(128, in_dim, generator=g)
            adapter[f"base_model.model.{module}.lora_B.weight"] = 0.01 * torch.randn(out_dim, 128, generator=g)
            modules.append(module)
    torch.save({"generator_lora": adapter}, tmp_path / "lora.pt")
    spec = CheckpointSpec(name="ll2", format="self_forcing", weights="model.pt", base="base", ema=False, lora="lora.pt")
    resolved = resolve_checkpoint(spec, tmp_path)
    assert len(resolved.lora.modules) == len(modules) == 10 * TINY5B.num_layers
    merged = load_checkpoint(resolved, device=torch.device("cpu")).state_dict()
    for module in modules:
        a, b = adapter[f"base_model.model.{module}.lora_A.weight"], adapter[f"base_model.model.{module}.lora_B.weight"]
        expected = state[f"{module}.weight"].double() + b.double() @ a.double()
        torch.testing.assert_close(merged[f"{module}.weight"].double(), expected, rtol=1e-5, atol=1e-6)


def test_edits_run_under_longlive2():
    """generation.interventions (issue 35's edits) apply to LongLive 2.0's calls: masking frame 0
    changes the video; the quantize_cache edit in kv_quant's format does too."""
    model = tiny5b(torch.float32)
    context = contexts(1)[0].float()
    base = {"num_frames": 8, "frames_per_block": 2, "local_attn_frames": 6, "sink_frames": 2, "denoising_steps": SHORT}
    plain = generate(model, context, options=ll2_options(**base), seed=0).latents
    for edit in (
        {"edit": "mask_keys", "heads": "all", "key_frames": [0]},
        {"edit": "quantize_cache", "format": KV_QUANT_FORMAT, "tensors": "both"},
    ):
        edited = generate(model, context, options=ll2_options(**base, interventions=[edit]), seed=0).latents
        assert torch.isfinite(edited).all() and not torch.equal(edited, plain), edit["edit"]
