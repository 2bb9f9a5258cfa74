"""The block kernels on and off, interleaved: a paired A/B where the host's speed drifts.

The 1.3B's 21-frame generation is host-bound on the lent machines, whose host speed changes
from call to call and within one (docs/performance.md). This times ``KernelSettings.fused_norms``
on and off in alternating generations of one process (``--rounds`` pairs after a warm-up of
each), eager and/or compiled (``--modes``; one compiled function pair serves both settings,
specialized once for each), and reports each setting's median and every pair's ratio.
Random bf16 weights at the Wan2.1-T2V-1.3B size (``gpu_benchmark.random_real_model``).

    PYTHONPATH=src python benchmarks/norms_ab.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_benchmark import random_context, random_real_model  # noqa: E402

from sinkscope.attention.settings import KernelSettings  # noqa: E402
from sinkscope.generation.sampler import generate  # noqa: E402
from sinkscope.options import GenerationOptions  # noqa: E402

SETTINGS = {"fused": KernelSettings(), "plain": KernelSettings(fused_norms=False)}


def paired(mode: str, rounds: int) -> dict:
    model, context, options = random_real_model(), random_context(), GenerationOptions()
    if mode == "compiled":
        model.compile_blocks(dynamic=False)

    def seconds(name: str) -> float:
        model.kernels = SETTINGS[name]
        torch.cuda.synchronize()
        began = time.perf_counter()
        generate(model, context, options=options, seed=0)
        torch.cuda.synchronize()
        return time.perf_counter() - began

    for name in SETTINGS:  # warm-up: compiled for each setting, allocator settled
        seconds(name)
        seconds(name)
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for index in range(rounds):
        order = list(SETTINGS) if index % 2 == 0 else list(reversed(SETTINGS))
        for name in order:
            times[name].append(seconds(name))
    ratios = [plain / fused for fused, plain in zip(times["fused"], times["plain"])]
    return {
        "mode": mode,
        "seconds": times,
        "median_seconds": {name: statistics.median(values) for name, values in times.items()},
        "video_fps_median": {name: 81 / statistics.median(values) for name, values in times.items()},
        "plain_over_fused_each_round": ratios,
        "plain_over_fused_median": statistics.median(ratios),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    parser.add_argument("--modes", default="eager,compiled", help="eager and/or compiled, comma-separated")
    parser.add_argument("--rounds", type=int, default=6, help="timed pairs a mode")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": []}
    for mode in args.modes.split(","):
        results["runs"].append(paired(mode, args.rounds))
        (out / "norms-ab.json").write_text(json.dumps(results, indent=1))
        run = results["runs"][-1]
        print(
            json.dumps({key: run[key] for key in ("mode", "video_fps_median", "plain_over_fused_median")}), flush=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
