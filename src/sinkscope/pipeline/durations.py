"""How long a study's jobs take: an estimate from their size (no torch, nothing run).

``sinkscope check`` ends with it. An extraction job is a process start, the weights
read, and the generation: per model call, a fixed cost per layer (kernel launches on
CUDA, the interpreter and small tensors on the CPU) and per captured layer, plus its
floating-point work at an effective speed. Every other job (prompts, tables, figures,
the summary page) costs a process start and its imports. The constants were measured:

- CUDA, an H100: one Self-Forcing extraction job of 30 layers (21 frames, 480x832) in a
  fresh process 18.5 s wall: 4.8 s reading 5.7 GB of weights, 6.7 s generating
  (docs/performance.md); ``generation_flops`` gives 1.7e15 for it, so 2.4e14 FLOP/s.
- CPU, the 2-core machine of the README (shared, one thread a job): the demo's
  extraction job (21 frames, 35 calls, 2.1e10 FLOP) generates in 1.4 s with one layer
  captured and 2.3 s with six, which 3e10 FLOP/s, 2.5 ms a call per layer and 4 ms more
  per captured layer give back; a process that imports torch and loads the demo takes
  3-5 s; the whole demo study (53 jobs) took 3 min 41 s of CPU (the model: 3 min).

Other GPUs and CPUs differ; the check says it is an estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sinkscope.model.config import WanConfig
from sinkscope.options import GenerationOptions
from sinkscope.pipeline.resources import parameter_count


@dataclass(frozen=True)
class DeviceSpeed:
    """The constants of one kind of device (see the module docstring)."""

    start_seconds: float  # a job's process: interpreter, imports, device set-up
    load_seconds: float  # reading weights: fixed part
    load_bytes_per_second: float
    call_layer_seconds: float  # per model call and layer, whatever its size
    captured_layer_seconds: float  # per model call and captured layer, on top
    flops_per_second: float


SPEEDS = {
    "cuda": DeviceSpeed(7.0, 0.0, 1.2e9, 1e-4, 2e-4, 2.4e14),
    "cpu": DeviceSpeed(3.0, 1.0, 2e8, 2.5e-3, 4e-3, 3e10),
}
# A job other than an extraction (prompts, tables, a figure, the summary page): a Python
# process importing pandas and matplotlib, then seconds of work at the demo's size.
OTHER_JOB_SECONDS = 2.5
# A video's decode through the Wan VAE.
DECODE_JOB_SECONDS = 15.0


def generation_flops(
    config: WanConfig, options: GenerationOptions, *, captured_layers: int, switch_frames: Sequence[int] = ()
) -> float:
    """Floating-point operations of one generation: every call's matrix products (2 per
    parameter and query token), its self-attention over the cached keys and its
    cross-attention over the prompt (4 per query, key and channel in each layer), and a
    second pass over the scores of each captured layer (the statistics). A call's keys are
    counted as the cache half full (it fills as the video goes) or the policy's bound."""
    tokens = config.frame_seq_length(options.latent_height, options.latent_width)
    queries = options.largest_call_frames(switch_frames) * tokens
    keys = min(options.kv_cache_frames, options.num_frames // 2 + options.largest_call_frames()) * tokens
    per_call = 2 * parameter_count(config) * queries
    per_call += 4 * config.num_layers * config.dim * queries * (keys + config.text_len)
    per_call += 4 * captured_layers * config.dim * queries * keys
    return float(options.calls(switch_frames) * per_call)


def _speed(device: str) -> DeviceSpeed:
    return SPEEDS["cuda" if device.startswith("cuda") else "cpu"]


def job_start_seconds(device: str, *, weight_bytes: int) -> float:
    """Seconds of an extraction job before it generates: its process, the weights read."""
    speed = _speed(device)
    return speed.start_seconds + speed.load_seconds + weight_bytes / speed.load_bytes_per_second


def generation_seconds(
    config: WanConfig,
    options: GenerationOptions,
    device: str,
    *,
    captured_layers: int,
    switch_frames: Sequence[int] = (),
) -> float:
    """Seconds of one generation with ``captured_layers`` captured, the model loaded."""
    speed = _speed(device)
    calls = options.calls(switch_frames)
    return (
        calls * (config.num_layers * speed.call_layer_seconds + captured_layers * speed.captured_layer_seconds)
        + generation_flops(config, options, captured_layers=captured_layers, switch_frames=switch_frames)
        / speed.flops_per_second
    )


def extraction_seconds(
    config: WanConfig,
    options: GenerationOptions,
    device: str,
    *,
    captured_layers: int,
    weight_bytes: int,
    switch_frames: Sequence[int] = (),
) -> float:
    """Seconds of one extraction job of one run on ``device`` (an estimate)."""
    start = job_start_seconds(device, weight_bytes=weight_bytes)
    return start + generation_seconds(
        config, options, device, captured_layers=captured_layers, switch_frames=switch_frames
    )


def describe_seconds(seconds: float) -> str:
    """'40 s', '4 min', '2.5 h': two significant figures at most."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.2g} h"
    return f"{seconds / 86400:.2g} days"
