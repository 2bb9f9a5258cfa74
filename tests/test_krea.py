"""Krea Realtime 14B (``generation.procedure: krea_recompute``) on Wan2.1-T2V-14B.

Krea's code cannot be run here (CC-BY-NC-SA-4.0; no released weights on these machines):
the reference is the procedure as the fact sheet describes it
(/work/shared/reference/longlive2-and-krea14b.md, 2.3 and 2.4), written out plainly below
as full forwards of the model without a KV cache in float64: block 0 alone at RoPE frames
0-2; every later block as one forward over [context, block] at RoPE frames 0-5 with a
block-causal frame mask (the context at t = 0 sees only itself, the block sees all six).
Every call of the cached procedure (its keys, queries, RoPE positions, what it attends) is
compared with that forward's, and so is the video.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO
from fakes import wan_config_json
from safetensors.torch import save_file
from test_stats import brute_force_statistics

from sinkscope.errors import ConfigError, WeightsError
from sinkscope.generation.capture import FrameStatsCapture
from sinkscope.generation.common import FlowMatchSchedule
from sinkscope.generation.krea import krea_denoising_steps
from sinkscope.generation.sampler import block_causal_frame_mask, generate
from sinkscope.model import WanConfig, build_model
from sinkscope.model.checkpoints import CheckpointSpec, resolve_checkpoint
from sinkscope.model.config import MODEL_CONFIGS
from sinkscope.model.loading import load_transformer
from sinkscope.options import GenerationOptions, OptionsError
from sinkscope.pipeline.resources import AUTO_MEMORY_SHARE, auto_layers_per_job, estimate_job_memory, parameter_count

# The 14B's architecture (Wan2.1 T2V; 40 layers of 40 heads of 128 there), shrunk.
KREA_TINY = WanConfig(
    dim=64,
    ffn_dim=96,
    num_heads=4,
    num_layers=2,
    in_dim=4,
    out_dim=4,
    text_dim=16,
    text_len=8,
    freq_dim=16,
    latent_height=4,
    latent_width=6,
)
FSL = KREA_TINY.frame_seq_length()  # 6 tokens a frame
BLOCK = 3
STEPS = krea_denoising_steps(4)


def options(num_frames: int = 12, **extra) -> GenerationOptions:
    return GenerationOptions.from_config(
        {
            "procedure": "krea_recompute",
            "num_frames": num_frames,
            "denoising_steps": STEPS,
            "recompute_context": "latent",
            **extra,
        }
    )


def tiny_model() -> torch.nn.Module:
    return build_model(KREA_TINY, seed=5, dtype=torch.float64)


def text() -> torch.Tensor:
    return torch.randn(1, 5, KREA_TINY.text_dim, generator=torch.Generator().manual_seed(2), dtype=torch.float64)


class FakeVAE:
    """A causal stand-in for Wan's VAE: video frame 0 from latent 0, frames 4f-3..4f from
    latents f and f - 1 (as a causal decoder's depend on the past); encode maps one frame
    back to one latent. Linear maps, so the re-encoded frame differs from every latent."""

    def __init__(self, channels: int) -> None:
        g = torch.Generator().manual_seed(9)
        self.up = torch.randn(3, channels, generator=g, dtype=torch.float64)
        self.down = torch.randn(channels, 3, generator=g, dtype=torch.float64)

    def _pixels(self, z: torch.Tensor) -> torch.Tensor:  # [1, C, h, w] -> [1, 3, 8h, 8w]
        return torch.einsum("oc,bchw->bohw", self.up, z).repeat_interleave(8, -2).repeat_interleave(8, -1)

    def decode_pixels(self, latents: torch.Tensor) -> torch.Tensor:
        frames = [self._pixels(latents[:, :, 0])]
        for f in range(1, latents.shape[2]):
            for j in range(4):
                frames.append(self._pixels(latents[:, :, f]) * (j + 1) / 4 + self._pixels(latents[:, :, f - 1]) * 0.1)
        return torch.stack(frames, dim=2)

    def pixel_stream(self):
        """The same frames for latents pushed in pieces: the whole prefix kept, its new frames returned."""
        vae = self

        class Stream:
            seen: torch.Tensor | None = None

            def push(self, latents: torch.Tensor) -> torch.Tensor:
                done = 0 if self.seen is None else 1 + 4 * (self.seen.shape[2] - 1)
                self.seen = latents if self.seen is None else torch.cat([self.seen, latents], dim=2)
                return vae.decode_pixels(self.seen)[:, :, done:]

        return Stream()

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        assert video.shape[2] == 1  # one frame alone: one latent
        pooled = torch.nn.functional.avg_pool2d(video[:, :, 0], 8)
        return torch.einsum("co,bohw->bchw", self.down, pooled)[:, :, None]


# -- the fact sheet's procedure, written plainly ------------------------------------------------


def plain_krea(model, context, opts: GenerationOptions, seed: int, vae=None):
    """Krea's procedure as full forwards without a cache; returns the latents and, per
    call, (q, k) of every layer as that forward's attention saw them."""
    flow = FlowMatchSchedule(opts.timestep_shift)
    timesteps = flow.denoising_timesteps(opts.denoising_steps, True)
    num_blocks = opts.num_frames // BLOCK
    channels, height, width = model.config.in_dim, model.config.latent_height, model.config.latent_width
    renoise = num_blocks * BLOCK * (len(timesteps) - 1)
    # One generator: every frame's initial noise, then the re-noising draws in order.
    noise = torch.randn(
        (opts.num_frames + renoise, channels, height, width), generator=torch.Generator().manual_seed(seed)
    )
    initial, fresh = noise[: opts.num_frames], list(noise[opts.num_frames :].split(BLOCK))
    seen = []  # per forward: {layer: (q, k)}
    outputs = []
    for b in range(num_blocks):
        n = b * BLOCK
        if b == 0:
            context_latents = None
        elif b == 1:
            context_latents = torch.cat(outputs, dim=2)[:, :, :BLOCK]  # [z0, z1, z2]
        else:
            video = vae.decode_pixels(torch.cat(outputs, dim=2)) if vae is not None else None
            # E: the oldest of the last 1 + (3 - 1) 4 = 9 decoded frames, encoded alone.
            oldest = (
                vae.encode(video[:, :, -9:-8]) if vae is not None else torch.cat(outputs, dim=2)[:, :, n - 3 : n - 2]
            )
            context_latents = torch.cat([oldest, torch.cat(outputs, dim=2)[:, :, n - 2 : n]], dim=2)
        x = initial[n : n + BLOCK].permute(1, 0, 2, 3)[None].double()
        for step, t in enumerate(timesteps):
            with AttentionRecorder(model) as calls:
                if context_latents is None:
                    v = model(x, torch.full((1, BLOCK), t, dtype=torch.float64), context)
                else:
                    both = torch.cat([context_latents, x], dim=2)
                    t_frames = torch.tensor([[0.0] * BLOCK + [t] * BLOCK], dtype=torch.float64)
                    mask = block_causal_frame_mask([BLOCK, BLOCK])  # context sees itself, the block all six
                    v = model(both, t_frames, context, frame_mask=mask)[:, :, BLOCK:]
            seen.append(calls)
            sigma = flow.sigma(t)
            x0 = x - sigma * v
            if step + 1 < len(timesteps):
                next_sigma = flow.sigma(timesteps[step + 1])
                eps = fresh.pop(0).permute(1, 0, 2, 3)[None]
                # DMD's re-noising, in float32 as the schedule computes it (the rest in float64).
                x = ((1 - next_sigma) * x0.float() + next_sigma * eps).double()
        outputs.append(x0)
    return torch.cat(outputs, dim=2), seen


class AttentionRecorder:
    """Context manager: the roped q and k every layer's self-attention gets, by layer."""

    def __init__(self, model) -> None:
        self.model = model

    def __enter__(self) -> dict:
        self.calls: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.saved = []
        for index, block in enumerate(self.model.blocks):
            attention = block.self_attn
            original = attention.attend
            self.saved.append((attention, original))

            def attend(q, k, v, *args, _index=index, _original=original, **kwargs):
                self.calls[_index] = (q.clone(), k.clone())
                return _original(q, k, v, *args, **kwargs)

            attention.attend = attend
        return self.calls

    def __exit__(self, *exc) -> None:
        for attention, _ in self.saved:
            del attention.attend  # back to the class's method


class CallRecorder:
    """Observer of the cached procedure: per call and layer, q, k and the layout."""

    def __init__(self, model) -> None:
        self.calls: list = []
        self.current = None
        for layer in range(len(model.blocks)):
            model.set_observer(layer, self._observer(layer))

    def begin_call(self, info) -> None:
        self.current = {"info": info}
        self.calls.append(self.current)

    def _observer(self, layer):
        def observe(q, k, v, layout, frame_bias=None):
            self.current[layer] = (q.clone(), k.clone(), layout)
            return None

        return observe


@pytest.mark.parametrize("vae", [False, True], ids=["latent-context", "reencoded-context"])
def test_every_call_matches_the_plain_procedure(vae):
    """9 frames = 3 blocks: block 1's context is z0..z2, block 2's oldest frame re-encoded (or kept)."""
    model, context = tiny_model(), text()
    codec = FakeVAE(KREA_TINY.in_dim) if vae else None
    opts = options(9, recompute_context="reencode" if vae else "latent")
    expected, plain_calls = plain_krea(model, context, opts, seed=3, vae=codec)
    recorder = CallRecorder(model)
    result = generate(model, context, options=opts, seed=3, observers=[recorder], vae=codec)
    torch.testing.assert_close(result.latents, expected, rtol=0, atol=1e-10)
    assert len(result.calls) == opts.num_calls == 3 * 4 + 2
    plain = 0  # the plain forward of the next denoising call
    for call in recorder.calls:
        info = call["info"]
        n = info.block * BLOCK
        forward = plain_calls[plain]
        if info.pass_ == "recompute":
            # The context frames (absolute), t = 0, roped from 0, attending only themselves: the
            # context rows of the block's plain forward.
            assert (info.step, info.timestep, info.start_frame, info.num_frames) == (0, 0.0, n - BLOCK, BLOCK)
            for layer in range(KREA_TINY.num_layers):
                q, k, layout = call[layer]
                torch.testing.assert_close(q, forward[layer][0][:, : BLOCK * FSL], rtol=0, atol=1e-10)
                torch.testing.assert_close(k, forward[layer][1][:, : BLOCK * FSL], rtol=0, atol=1e-10)
                assert layout.query_frames == layout.key_frames == tuple(range(n - BLOCK, n))
                assert [f + s for f, s in zip(layout.key_frames, layout.key_position_shift)] == [0, 1, 2]
                assert layout.query_position_shift == -(n - BLOCK) and set(layout.relative_position_shift) == {0}
            continue
        plain += 1
        keys = tuple(range(max(0, n - BLOCK), n + BLOCK))
        for layer in range(KREA_TINY.num_layers):
            q, k, layout = call[layer]
            assert layout.query_frames == tuple(range(n, n + BLOCK)) and layout.key_frames == keys
            # Positions never grow: keys at 0 .. 5 (block 0: 0 .. 2), the block after the context.
            assert [f + s for f, s in zip(layout.key_frames, layout.key_position_shift)] == list(range(len(keys)))
            assert layout.query_position_shift == min(n, BLOCK) - n and set(layout.relative_position_shift) == {0}
            torch.testing.assert_close(k, forward[layer][1], rtol=0, atol=1e-10)  # the six frames the block sees
            torch.testing.assert_close(q, forward[layer][0][:, -BLOCK * FSL :], rtol=0, atol=1e-10)
    assert plain == len(plain_calls)


def test_the_reencode_decodes_each_latent_once():
    """15 frames = 5 blocks, three re-encodes: the streaming decode (each block's new latents
    pushed once) gives the plain procedure's latents, which decode the whole prefix every block."""
    model, context = tiny_model(), text()
    codec = FakeVAE(KREA_TINY.in_dim)
    pushed = []
    stream = codec.pixel_stream
    codec.pixel_stream = lambda: _Recording(stream(), pushed)
    opts = options(15, recompute_context="reencode")
    expected, _ = plain_krea(model, context, opts, seed=2, vae=codec)
    result = generate(model, context, options=opts, seed=2, vae=codec)
    torch.testing.assert_close(result.latents, expected, rtol=0, atol=1e-10)
    assert pushed == [4, 3, 3]  # latents 0-3, 4-6, 7-9: E of latents 3, 6 and 9


class _Recording:
    def __init__(self, stream, pushed: list) -> None:
        self.stream, self.pushed = stream, pushed

    def push(self, latents):
        self.pushed.append(latents.shape[2])
        return self.stream.push(latents)


def test_cache_edits_reach_the_recomputed_context_once_a_block(monkeypatch):
    """quantize_cache under Krea's procedure: at every block after the first, the context frames
    the recompute call just wrote (not the finished block's slots of an older cache) are
    quantized once; block 0 is the untouched video's."""
    from sinkscope.model.generation_edits import GenerationEdits

    edited = []
    real = GenerationEdits.edit_cache

    def spy(self, cache, frames):
        edited.append(tuple(frames))
        return real(self, cache, frames)

    monkeypatch.setattr(GenerationEdits, "edit_cache", spy)
    model, context = tiny_model(), text()
    plain = generate(model, context, options=options(12), seed=1)
    quantized = generate(
        model,
        context,
        options=options(12, interventions=[{"edit": "quantize_cache", "format": "int4", "tensors": "both"}]),
        seed=1,
    )
    assert edited == [(0, 1, 2), (3, 4, 5), (6, 7, 8)]
    torch.testing.assert_close(quantized.latents[:, :, :BLOCK], plain.latents[:, :, :BLOCK], rtol=0, atol=0)
    assert not torch.allclose(quantized.latents[:, :, BLOCK:], plain.latents[:, :, BLOCK:])


def test_reencode_needs_the_vae():
    model, context = tiny_model(), text()
    with pytest.raises(
        OptionsError, match="generation.recompute_context: 'reencode' needs the Wan VAE \\(none was passed as vae\\)"
    ):
        generate(model, context, options=options(recompute_context="reencode"), seed=0)
    # Two blocks never re-encode (block 1's context is z0, z1, z2): no VAE needed.
    assert generate(model, context, options=options(6, recompute_context="reencode"), seed=0).latents.shape[2] == 6


def test_timesteps_are_krea_schedule():
    """Fact sheet 2.3: 4 steps t = [1000, 908.84, 713.98, 0], 5 steps [1000, 937.5, 833.33, 625, 0];
    the last pass's sigma is the table's last, 0.00498."""
    flow = FlowMatchSchedule(5.0)
    four = flow.denoising_timesteps(krea_denoising_steps(4), True)
    five = flow.denoising_timesteps(krea_denoising_steps(5), True)
    assert np.allclose(four, [1000, 908.84, 713.98, 0], atol=0.01)
    assert np.allclose(five, [1000, 937.5, 833.333, 625, 0], atol=0.001)
    assert math.isclose(flow.sigma(0.0), 0.00498, abs_tol=5e-6)
    assert [round(flow.sigma(t), 4) for t in four] == [1.0, 0.9088, 0.714, 0.005]
    # The example config runs Krea's 4 steps.
    config = yaml.safe_load((REPO / "configs" / "krea-realtime-14b.yaml").read_text())
    assert config["generation"]["denoising_steps"] == krea_denoising_steps(4)


def test_recompute_calls_are_captured_with_pass_recompute():
    model, context = tiny_model(), text()
    opts = options(9)
    keep = {}

    def tee(layer, observe):
        def both(q, k, v, layout, frame_bias=None):
            keep.setdefault(layer, []).append((capture._call, q.clone(), k.clone(), layout))
            return observe(q, k, v, layout)

        return both

    capture = FrameStatsCapture(model, [1], frame_seq_length=FSL, token_profiles="all")
    with capture:
        model.blocks[1].self_attn.observer = tee(1, model.blocks[1].self_attn.observer)
        generate(model, context, options=opts, seed=1, observers=[capture])
    rows = capture.layer_tables()[1]["frames"]
    calls = rows.groupby(["block", "pass", "step"], observed=True).ngroups
    assert calls == opts.num_calls == 3 * 4 + 2
    recompute = rows[rows["pass"] == "recompute"]
    assert sorted(set(zip(recompute["block"], recompute["step"], recompute["timestep"]))) == [(1, 0, 0.0), (2, 0, 0.0)]
    for block in (1, 2):
        part = recompute[recompute["block"] == block]
        context_frames = set(range(3 * block - 3, 3 * block))
        assert set(part["query_frame"]) == set(part["key_frame"]) == context_frames
    assert (rows["key_position_shift"] == 0).all()
    sums = rows.groupby(["block", "pass", "step", "head", "query_frame"], observed=True)["prob_mass"].sum()
    assert np.allclose(sums, 1.0, atol=1e-6)
    # Each captured call's prob_mass against a float64 brute force over the keys it saw.
    scale = KREA_TINY.head_dim**-0.5
    table = rows.set_index(["block", "pass", "step", "head", "query_frame", "key_frame"])["prob_mass"].sort_index()
    for info, q, k, layout in keep[1]:
        ref = brute_force_statistics(
            q[0].transpose(0, 1), k[0].transpose(0, 1), FSL, len(layout.query_frames), list(layout.key_lengths), scale
        )["prob_mass"]
        got = table.loc[(info.block, info.pass_, info.step)].unstack("key_frame").loc[:, list(layout.key_frames)]
        assert np.allclose(got.to_numpy().reshape(ref.shape), ref.numpy(), atol=1e-5)


# -- options ------------------------------------------------------------------------------------


def test_options_of_the_procedure():
    opts = options(27)
    assert opts.cache_policy == "krea_recompute" and opts.local_attn_frames == 6 and opts.kv_cache_frames == 6
    assert opts.num_calls == 9 * 4 + 8 and opts.largest_call_frames() == 3
    assert opts.to_dict()["recompute_context"] == "latent"
    assert "recompute_context" not in GenerationOptions.from_config({"num_frames": 21}).to_dict()
    with pytest.raises(OptionsError, match=r"generation.local_attn_frames: 9 must be 2 x frames_per_block = 6"):
        options(local_attn_frames=9)
    with pytest.raises(
        OptionsError, match=r"generation.recompute_context: has no meaning under procedure 'self_forcing'"
    ):
        GenerationOptions.from_config({"recompute_context": "latent"})
    with pytest.raises(OptionsError, match=r"generation.independent_first_frame"):
        options(13, independent_first_frame=True)
    with pytest.raises(OptionsError, match="generation.procedure: 'krea_recompute' generates a video under one prompt"):
        options().check_prompt_switches([6])


def test_schema_accepts_the_procedure():
    from sinkscope.pipeline.config import normalize_config

    config = normalize_config(
        {"generation": {"procedure": "krea_recompute", "num_frames": 9, "recompute_context": "latent"}}
    )
    assert config["generation"]["procedure"] == "krea_recompute"
    with pytest.raises(ConfigError, match="recompute_context"):
        normalize_config({"generation": {"procedure": "krea_recompute", "recompute_context": "pixels"}})


# -- weights -------------------------------------------------------------------------------------


def write_krea_safetensors(path: Path, state: dict[str, torch.Tensor]) -> Path:
    """Krea's layout: one flat safetensors dict, every key prefixed ``model.`` (no wrapper)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({f"model.{key}": value.contiguous() for key, value in state.items()}, str(path))
    return path


def test_krea_safetensors_loads_as_wan_format(tmp_path):
    model = build_model(KREA_TINY, seed=7)
    weights = write_krea_safetensors(
        tmp_path / "krea-realtime-video" / "krea-realtime-video-14b.safetensors", model.state_dict()
    )
    base = tmp_path / "wan_models" / "Wan2.1-T2V-14B"
    base.mkdir(parents=True)
    (base / "config.json").write_text(
        __import__("json").dumps({**wan_config_json(KREA_TINY), "text_dim": KREA_TINY.text_dim})
    )
    resolved = resolve_checkpoint(CheckpointSpec("krea", weights=str(weights), base=str(base)), tmp_path)
    assert resolved.format == "wan" and resolved.model_config.num_layers == KREA_TINY.num_layers
    loaded = load_transformer(weights, base=base)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    # A key missing from the file is named.
    state = {k: v for k, v in model.state_dict().items() if k != "blocks.1.self_attn.k.weight"}
    broken = write_krea_safetensors(tmp_path / "broken.safetensors", state)
    with pytest.raises(ConfigError, match=r"1 missing \(first: blocks.1.self_attn.k.weight\)"):
        resolve_checkpoint(CheckpointSpec("krea", weights=str(broken), base=str(base)), tmp_path)
    with pytest.raises(WeightsError, match="missing"):
        load_transformer(broken, model=KREA_TINY)


# -- the memory plan ---------------------------------------------------------------------------------


def test_memory_plan_of_the_14b_on_an_80_gb_gpu():
    config = MODEL_CONFIGS["wan2.1-t2v-14b"]
    assert (config.num_layers, config.num_heads, config.dim) == (40, 40, 5120)
    opts = GenerationOptions.from_config({"procedure": "krea_recompute", "num_frames": 27, "denoising_steps": STEPS})
    one = estimate_job_memory(config, opts, "bfloat16", captured_layers=1)
    assert abs(one.weights - 28.6e9) < 0.1e9 and one.weights == 2 * parameter_count(config)
    assert one.kv_cache == 40 * 2 * (9360 + 512) * 5120 * 2  # 6 frames of 1560 tokens and the text, K and V
    assert one.activations == 3 * 1560 * (12 * 5120 + 2 * 13824) * 4  # the widest call: one block
    assert one.vae > 0 and estimate_job_memory(config, options(27), "bfloat16", captured_layers=1).vae == 0
    # The re-encode's streaming decode holds one piece (13 video frames), however long the video.
    longer = GenerationOptions.from_config({"procedure": "krea_recompute", "num_frames": 120, "denoising_steps": STEPS})
    assert estimate_job_memory(config, longer, "bfloat16", captured_layers=1).vae == one.vae
    # An H100's 80 GB holds every layer's capture: auto captures all 40 in one job.
    assert auto_layers_per_job(config, opts, "bfloat16", layers=40, memory_bytes=80 * 10**9) == 40
    # Where only some fit, auto takes the most that fit; unknown memory: all.
    for n in (1, 7, 23):
        budget = estimate_job_memory(config, opts, "bfloat16", captured_layers=n).total / AUTO_MEMORY_SHARE
        assert auto_layers_per_job(config, opts, "bfloat16", layers=40, memory_bytes=int(budget) + 1) == n
    assert auto_layers_per_job(config, opts, "bfloat16", layers=40, memory_bytes=None) == 40


def test_reencode_through_the_wan_vae(tmp_path):
    """The checkpoint's Wan2.1_VAE.pth (a tiny one of the release's layout) found in its base
    folder, loaded, and used as the plain procedure uses it: E from the full decode's frames."""
    from test_video import original_layout, tiny_module

    from sinkscope.generation.krea import load_reencode_vae

    config = WanConfig(**{**KREA_TINY.to_dict(), "in_dim": 16, "out_dim": 16})
    model = build_model(config, seed=5, dtype=torch.float64)
    base = tmp_path / "Wan2.1-T2V-14B"
    base.mkdir()
    (base / "config.json").write_text(
        __import__("json").dumps({**wan_config_json(config), "text_dim": config.text_dim})
    )
    torch.save(original_layout(tiny_module("wan2.1"), "wan2.1"), base / "Wan2.1_VAE.pth")
    weights = write_krea_safetensors(tmp_path / "krea.safetensors", model.state_dict())
    resolved = resolve_checkpoint(CheckpointSpec("krea", weights=str(weights), base=str(base)), tmp_path)
    opts = options(9, recompute_context="reencode")
    vae = load_reencode_vae(resolved, opts, torch.device("cpu"))
    assert load_reencode_vae(resolved, options(9), torch.device("cpu")) is None  # recompute_context: latent

    class Float64:  # the plain procedure works in float64: the VAE's float32 latents cast
        decode_pixels = staticmethod(vae.decode_pixels)

        @staticmethod
        def encode(frames):
            return vae.encode(frames).double()

    expected, _ = plain_krea(model, text(), opts, seed=4, vae=Float64)
    result = generate(model, text(), options=opts, seed=4, vae=vae)
    torch.testing.assert_close(result.latents, expected, rtol=0, atol=1e-9)
    without = generate(model, text(), options=options(9), seed=4)
    assert not torch.allclose(without.latents[:, :, 6:], result.latents[:, :, 6:])  # block 2 saw E, not z3
    torch.testing.assert_close(without.latents[:, :, :6], result.latents[:, :, :6], rtol=0, atol=0)


def test_check_refuses_reencode_without_a_vae(tmp_path):
    from sinkscope.pipeline.config import checked_config

    weights = write_krea_safetensors(tmp_path / "krea.safetensors", build_model(KREA_TINY, seed=7).state_dict())
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(
        __import__("json").dumps({**wan_config_json(KREA_TINY), "text_dim": KREA_TINY.text_dim})
    )
    config = {
        "checkpoints": {"krea": {"weights": str(weights), "base": str(base)}},
        "layers": [0],
        "figures": {"heads": ["L1H1"]},
        "generation": {"procedure": "krea_recompute", "num_frames": 9, "denoising_steps": STEPS},
    }
    with pytest.raises(
        ConfigError, match=r"config key generation.recompute_context: 'reencode' needs checkpoint 'krea'"
    ):
        checked_config(config, tmp_path)
    # The job's own loader says the same, naming where it looked.
    from sinkscope.generation.krea import load_reencode_vae

    resolved = resolve_checkpoint(CheckpointSpec("krea", weights=str(weights), base=str(base)), tmp_path)
    with pytest.raises(
        OptionsError, match=rf"'reencode' needs checkpoint 'krea''s Wan VAE \(looked at {re.escape(str(base))}"
    ):
        load_reencode_vae(resolved, options(9, recompute_context="reencode"), torch.device("cpu"))
    checked_config(
        {**config, "generation": {**config["generation"], "num_frames": 6}}, tmp_path
    )  # two blocks: no re-encode
    (base / "Wan2.1_VAE.pth").touch()
    checked_config(config, tmp_path)  # found (its weights are read by the job)


def test_the_reencoding_extraction_reruns_when_the_vae_bytes_change(tmp_path):
    """Krea's re-encode runs the VAE inside the extraction job: its digest is a param of the
    job (new bytes rerun it, a touch does not); a run that does not re-encode gets ''."""
    from sinkscope.pipeline.config import checked_config
    from sinkscope.pipeline.study import Study

    weights = write_krea_safetensors(tmp_path / "krea.safetensors", build_model(KREA_TINY, seed=7).state_dict())
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(
        __import__("json").dumps({**wan_config_json(KREA_TINY), "text_dim": KREA_TINY.text_dim})
    )
    vae = base / "Wan2.1_VAE.pth"
    vae.write_bytes(b"first")
    generation = {"procedure": "krea_recompute", "num_frames": 9, "denoising_steps": STEPS}
    config = {
        "checkpoints": {"krea": {"weights": str(weights), "base": str(base)}},
        "layers": [0],
        "figures": {"heads": ["L1H1"]},
        "generation": generation,
        "variants": {"default": {}, "latent": {"recompute_context": "latent"}},
    }

    def digests():
        normalized, resolved = checked_config(config, tmp_path)
        study = Study(normalized, str(tmp_path), checkpoints=resolved)
        return study.generation_vae_sha256("krea"), study.generation_vae_sha256("krea@latent")

    first, latent = digests()
    assert len(first) == 64 and latent == ""
    os.utime(vae, (1, 1))
    assert digests()[0] == first  # a touch: the same bytes
    vae.write_bytes(b"other")
    assert digests()[0] not in ("", first)
