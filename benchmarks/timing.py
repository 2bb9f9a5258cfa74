"""What the generation benchmarks share: one generation, uncaptured or with ``layers``
captured, timed as ``gpu_benchmark.py``'s generation section counts it (the generation's
own synchronized seconds, plus collecting the rows when captured)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from sinkscope.generation.capture import FrameStatsCapture
from sinkscope.generation.common import GenerationResult
from sinkscope.generation.sampler import generate


def captured_generation(model, context, options, layers: Sequence[int], frame_seq_length: int,
                        seed: int = 0, fused: bool = False) -> tuple[GenerationResult, float, int]:
    """(the generation's result, seconds collecting the frame rows, their count): without
    ``layers`` an uncaptured generation, 0.0 and 0. ``fused``: the ``capture.attention: fused``
    route (one Triton pass for the output and the statistics) instead of ``exact``."""
    if not layers:
        return generate(model, context, options=options, seed=seed), 0.0, 0
    with FrameStatsCapture(model, layers, frame_seq_length=frame_seq_length, fused_attention=fused) as capture:
        result = generate(model, context, options=options, seed=seed, observers=[capture])
        began = time.perf_counter()
        rows = len(capture.to_frame())
        return result, time.perf_counter() - began, rows
