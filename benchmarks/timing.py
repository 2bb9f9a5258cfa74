"""What the generation benchmarks share: one generation, uncaptured or with ``layers``
captured, timed as ``gpu_benchmark.py``'s generation section counts it (the generation's
own synchronized seconds, plus collecting the rows when captured), or as an extraction job
runs it (each call's rows handed to the job's writer threads while the generation goes on)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from sinkscope.generation.capture import FRAME_STAT_NAMES, FrameStatsCapture
from sinkscope.generation.common import GenerationResult
from sinkscope.generation.sampler import generate
from sinkscope.naming import layer_file
from sinkscope.pipeline.writing import ExtractionWriter, default_workers


def captured_generation(
    model,
    context,
    options,
    layers: Sequence[int],
    frame_seq_length: int,
    seed: int = 0,
    attention: str = "exact",
    written: bool = False,
    token_profiles: str = "last_block",
    details: dict | None = None,
    statistics: Sequence[str] = FRAME_STAT_NAMES,
) -> tuple[GenerationResult, float, int]:
    """(the generation's result, seconds collecting the frame rows, their count): without
    ``layers`` an uncaptured generation, 0.0 and 0. ``fused``: the ``capture.attention: fused``
    route (one Triton pass for the output and the statistics) instead of ``exact``.
    ``token_profiles``: which calls get key-token profiles (``FrameStatsCapture``'s choice; a
    job's default is the last block's). ``written``: as an extraction job
    (``pipeline.extract``) does it, each call's record handed to an ``ExtractionWriter`` (a
    job's writer threads, files in a temporary folder) during the generation; the collecting
    seconds are then its ``finish`` (the queued records, the last block, the files closed);
    ``details``, when given, gets the writer's timings (the generation's seconds handing
    records over, the writer threads' busy seconds, finish's drain and close)."""
    if not layers:
        return generate(model, context, options=options, seed=seed), 0.0, 0
    with tempfile.TemporaryDirectory() as folder:
        writer = None
        if written:
            run = {"checkpoint": "benchmark", "variant": "default", "prompt_id": "p0", "seed": int(seed)}
            writer = ExtractionWriter(
                folder,
                layers,
                frame_seq_length=frame_seq_length,
                run_columns=run,
                workers=default_workers(model.device, len(layers)),
            )
        try:
            with FrameStatsCapture(
                model,
                layers,
                frame_seq_length=frame_seq_length,
                attention=attention,
                statistics=statistics,
                token_profiles=token_profiles,
                handoff=writer.submit if writer else None,
            ) as capture:
                result = generate(model, context, options=options, seed=seed, observers=[capture])
                began = time.perf_counter()
                if writer is None:  # the rows collected after the generation
                    rows = len(capture.to_frame())
                    return result, time.perf_counter() - began, rows
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        _, counts = writer.finish({"benchmark": "timing.captured_generation"})
        seconds = time.perf_counter() - began
        if details is not None:
            details.update(writer.timings, drain_seconds=writer.drain_seconds, close_seconds=writer.close_seconds)
        return result, seconds, sum(counts[Path(layer_file(folder, layer)).name] for layer in layers)
