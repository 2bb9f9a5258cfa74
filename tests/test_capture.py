"""Capture during generation: every call, absolute frames, values equal to a brute force."""

from __future__ import annotations

import pytest
import torch
from test_stats import brute_force

from sinkscope.capture import FrameStatsCapture
from sinkscope.generation import FlowMatchSchedule, GenerationOptions, generate
from sinkscope.model import build_model

FSL = 24  # the demo's tokens a frame


class Recorder:
    """Keeps the raw q and k of one layer, to recompute the statistics independently."""

    def __init__(self):
        self.calls = []
        self.info = None

    def begin_call(self, info):
        self.info = info

    def __call__(self, q, k, query_frames, key_frames):
        self.calls.append((self.info, q[0].transpose(0, 1).clone(), k[0].transpose(0, 1).clone(), query_frames, key_frames))


def run(options, layers=(0, 4), device="cpu", seed=0):
    model = build_model("demo", seed=0, device=device)
    context = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(1))
    capture = FrameStatsCapture(model, layers, frame_seq_length=FSL)
    recorder = Recorder()
    with capture:
        model.blocks[layers[0]].self_attn.observer = _tee(model.blocks[layers[0]].self_attn.observer, recorder)
        result = generate(model, context, options=options, seed=seed, observers=[capture, recorder])
    return capture.to_frame(), recorder, result


def _tee(first, second):
    def both(*args):
        first(*args)
        second(*args)

    return both


def test_every_call_is_captured_with_absolute_frames():
    options = GenerationOptions(num_frames=9)
    rows, recorder, result = run(options)
    assert [(c.block, c.pass_, c.step) for c in result.calls] == [
        (b, p, s) for b in range(3) for p, s in [("denoise", 0), ("denoise", 1), ("denoise", 2), ("denoise", 3), ("cache", 4)]
    ]
    per_call = rows.groupby(["layer", "block", "pass", "step"]).size()
    assert len(per_call) == 2 * 15
    last = rows[(rows["block"] == 2) & (rows["layer"] == 4)]
    assert sorted(set(last["query_frame"])) == [6, 7, 8]
    assert sorted(set(last["key_frame"])) == list(range(9))
    timesteps = sorted(set(rows.loc[rows["pass"] == "denoise", "timestep"].round(1)))
    assert timesteps == [625.0, 833.3, 937.5, 1000.0]
    assert set(rows.loc[rows["pass"] == "cache", "timestep"]) == {0.0}


def test_values_equal_a_float64_brute_force_of_the_same_q_and_k():
    options = GenerationOptions(num_frames=9, local_attn_frames=6, sink_frames=2)
    rows, recorder, _ = run(options)
    layer_rows = rows[rows["layer"] == 0]
    for info, q, k, query_frames, key_frames in recorder.calls:
        expected_logit, expected_mass = brute_force(q, k, FSL, query_frames, key_frames, q.shape[-1] ** -0.5)
        got = layer_rows[(layer_rows["block"] == info.block) & (layer_rows["pass"] == info.pass_) & (layer_rows["step"] == info.step)]
        got = got.sort_values(["head", "query_frame", "key_frame"])
        assert len(got) == expected_logit.numel()
        # Sliding window with 2 sinks: the last block sees frames 0, 1 and 5..8, by absolute index.
        torch.testing.assert_close(torch.tensor(got["logit_mean"].to_numpy(), dtype=torch.float64), expected_logit.flatten(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.tensor(got["prob_mass"].to_numpy(), dtype=torch.float64), expected_mass.flatten(), rtol=1e-5, atol=1e-7)
    last_keys = recorder.calls[-1][4]
    assert last_keys == [0, 1, 5, 6, 7, 8]


def test_seed_determines_the_video():
    options = GenerationOptions(num_frames=6)
    _, _, a = run(options, layers=(0,), seed=3)
    _, _, b = run(options, layers=(0,), seed=3)
    _, _, c = run(options, layers=(0,), seed=4)
    assert torch.equal(a.latents, b.latents)
    assert not torch.equal(a.latents, c.latents)


def test_schedule_matches_self_forcing():
    schedule = FlowMatchSchedule(shift=5.0)
    steps = schedule.denoising_timesteps([1000, 750, 500, 250], warp=True)
    assert steps == pytest.approx([1000.0, 937.5, 833.333, 625.0], abs=1e-3)
    assert schedule.sigma(937.5) == pytest.approx(0.9375, abs=1e-6)
    x, v = torch.ones(2), torch.full((2,), 0.5)
    assert torch.allclose(schedule.to_x0(v, x, 625.0), torch.full((2,), 1 - 0.625 * 0.5))


def test_capture_rejects_missing_layers():
    model = build_model("demo", seed=0)
    with pytest.raises(ValueError, match=r"layers \[6\] do not exist"):
        FrameStatsCapture(model, [6], frame_seq_length=FSL)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_capture_matches_cpu_in_float32(monkeypatch):
    # cuDNN convolutions default to TF32 on the GPU (the patch embedding); ask for fp32.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    options = GenerationOptions(num_frames=9)
    cpu_rows, _, cpu = run(options, device="cpu")
    gpu_rows, _, gpu = run(options, device="cuda")
    torch.testing.assert_close(gpu.latents.cpu(), cpu.latents, rtol=1e-3, atol=1e-3)
    for metric in ("logit_mean", "prob_mass"):
        torch.testing.assert_close(torch.tensor(gpu_rows[metric].to_numpy()), torch.tensor(cpu_rows[metric].to_numpy()), rtol=1e-3, atol=1e-4)
