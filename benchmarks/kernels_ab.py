"""One kernel setting on and off, interleaved: a paired A/B where the host's speed drifts.

The 1.3B's 21-frame generation is host-bound on the lent machines, whose host speed changes
from call to call and within one (docs/performance.md). This times one field of
``KernelSettings`` (``--setting``: ``cuda_graphs``, ``fused_norms``, ``fused_gelu``,
``key_split``) on and off in alternating generations of one process (``--rounds`` pairs
after two warm-ups of each), eager and/or compiled (``--modes``; one compiled function pair
serves both settings), and reports each side's median, every pair's ratio, and whether the
two sides' latents are the same to the bit (``cuda_graphs`` must be; the fused kernels round
differently). The rest of ``capture.kernels: fast`` is on in both. Runs (``--runs``):

- ``sf13b``: Self-Forcing at the Wan2.1-T2V-1.3B size: 21 frames (81 video frames), or a
  rollout of ``--sf-frames`` under ``--sf-policy`` (``long_rollout.policy_options``);
- ``ll2``: LongLive 2.0's procedure at the Wan2.2-TI2V-5B size, ``--ll2-frames`` latent frames
  (704x1280, chunks of 8, window 32 with an 8-frame sink),

random bf16 weights. ``--host-load N`` keeps N busy processes on the host's cores while it
times (a node shared with other jobs: the host issues launches slower). Writes
``--out``/kernels-ab-<setting><tag>.json.

    PYTHONPATH=src python benchmarks/kernels_ab.py --setting cuda_graphs --out $OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_benchmark import random_context, random_real_model  # noqa: E402
from long_rollout import policy_options  # noqa: E402
from longlive2_speed import options_for, real_model  # noqa: E402

from sinkscope.attention.settings import KernelSettings  # noqa: E402
from sinkscope.generation.sampler import generate  # noqa: E402
from sinkscope.options import GenerationOptions  # noqa: E402

SETTINGS = tuple(field.name for field in dataclasses.fields(KernelSettings))


def paired(run: str, mode: str, setting: str, rounds: int, args: argparse.Namespace) -> dict:
    if run == "sf13b":
        frames = args.sf_frames
        options = GenerationOptions() if args.sf_policy is None else policy_options(args.sf_policy, frames)
        model, video_frames = random_real_model(), 4 * frames - 3
    else:
        ll2_frames = args.ll2_frames
        model, options, video_frames = real_model(), options_for(ll2_frames, 8, 32, 8), 4 * ll2_frames - 3
    context = random_context()
    if mode == "compiled":
        model.compile_blocks(dynamic=False)
    sides = {"on": KernelSettings(), "off": dataclasses.replace(KernelSettings(), **{setting: False})}
    latents: dict[str, torch.Tensor] = {}
    peaks, graphed = dict.fromkeys(sides, 0), dict.fromkeys(sides, 0)

    def seconds(side: str) -> float:
        model.kernels = sides[side]
        # Each generation captures its own graphs, as a job's one generation does.
        model.layer_graphs.clear()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        began = time.perf_counter()
        result = generate(model, context, options=options, seed=0)
        torch.cuda.synchronize()
        took = time.perf_counter() - began
        latents.setdefault(side, result.latents)
        peaks[side] = max(peaks[side], torch.cuda.max_memory_allocated())
        graphed[side] = len(model.layer_graphs.graphed)
        return took

    for side in sides:  # warm-up: compiled, captured, allocator settled
        seconds(side)
        seconds(side)
    times: dict[str, list[float]] = {side: [] for side in sides}
    for index in range(rounds):
        for side in list(sides) if index % 2 == 0 else list(reversed(sides)):
            times[side].append(seconds(side))
    ratios = [off / on for on, off in zip(times["on"], times["off"])]
    return {
        "run": run,
        "mode": mode,
        "setting": setting,
        "options": options.to_dict(),
        "host_load": args.host_load,
        "seconds": times,
        "median_seconds": {side: statistics.median(values) for side, values in times.items()},
        "video_fps_median": {side: video_frames / statistics.median(values) for side, values in times.items()},
        "off_over_on_each_round": ratios,
        "off_over_on_median": statistics.median(ratios),
        "latents_identical": bool(torch.equal(latents["on"], latents["off"])),
        "graphed_signatures": graphed,
        "peak_memory_gib": {side: peak / 2**30 for side, peak in peaks.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    parser.add_argument("--setting", default="cuda_graphs", choices=SETTINGS, help="the KernelSettings field")
    parser.add_argument("--runs", default="sf13b", help="sf13b and/or ll2, comma-separated")
    parser.add_argument("--modes", default="eager,compiled", help="eager and/or compiled, comma-separated")
    parser.add_argument("--rounds", type=int, default=6, help="timed pairs a mode")
    parser.add_argument("--ll2-frames", type=int, default=32, help="LongLive 2.0's latent frames")
    parser.add_argument("--sf-frames", type=int, default=21, help="the 1.3B's latent frames")
    parser.add_argument("--sf-policy", default=None, help="the 1.3B's cache policy (default: the 21-frame default)")
    parser.add_argument("--tag", default="", help="appended to the JSON file's name")
    parser.add_argument("--host-load", type=int, default=0, help="busy processes kept on the host while timing")
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.host_load)]
    try:
        return compare(args)
    finally:
        for process in busy:
            process.kill()


def compare(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": []}
    for run in args.runs.split(","):
        for mode in args.modes.split(","):
            results["runs"].append(paired(run, mode, args.setting, args.rounds, args))
            (out / f"kernels-ab-{args.setting}{args.tag}.json").write_text(json.dumps(results, indent=1))
            entry = results["runs"][-1]
            keys = ("run", "mode", "video_fps_median", "off_over_on_median", "latents_identical", "graphed_signatures")
            print(json.dumps({key: entry[key] for key in keys}), flush=True)
            del entry
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
