"""Where an uncaptured generation's GPU time goes, by kind of kernel (torch.profiler).

For each ``--runs`` entry, ``--reps`` generations timed (the median is ``wall_seconds``) and one
under torch.profiler, after a warm-up, with random bf16 weights at a real size:

- ``sf13b``: Self-Forcing's 21 frames at the Wan2.1-T2V-1.3B size;
- ``ll2``: LongLive 2.0's procedure at the Wan2.2-TI2V-5B size, ``--ll2-frames`` latent
  frames (704x1280, chunks of 8, window 32 with an 8-frame sink);

each ``eager`` and/or ``compiled`` (``--modes``; compiled as a job compiles the blocks), with the
block's norms in ``sinkscope.model.block_kernels`` and/or as PyTorch ops (``--norms fused,plain``:
``KernelSettings.fused_norms``; the rest of ``capture.kernels: fast`` on in both), and with
or without CUDA graphs of the layers' work (``--graphs off,on``: ``KernelSettings.cuda_graphs``;
off by default, so that the profile is of the eager launches). Kernels
are put in kinds by name (``KINDS``: GEMMs, attention, Triton, norms, elementwise, copies, the
rest); each kind's launches and GPU milliseconds, the wall seconds, the GPU's busy share
(summed kernel time over wall time) and the top kernels are written to
``--out``/eager-profile.json and printed. It says which kernels a change must shorten.

    PYTHONPATH=src python benchmarks/eager_profile.py --out $OUT
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capture_profile import kernel_totals, profiled  # noqa: E402
from gpu_benchmark import random_context, random_real_model  # noqa: E402
from longlive2_speed import options_for, real_model  # noqa: E402

from sinkscope.attention.settings import KernelSettings  # noqa: E402
from sinkscope.generation.sampler import generate  # noqa: E402
from sinkscope.options import GenerationOptions  # noqa: E402

# The first pattern a kernel's lower-cased name contains decides its kind.
KINDS = (
    ("attention", ("fmha", "flash", "cudnn", "attention", "merge_kernel", "sdpa")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "cublas")),
    ("norm", ("layer_norm", "rms_norm", "layernorm", "rmsnorm", "welford")),
    ("triton", ("triton_",)),
    ("copy", ("copy", "memcpy", "memset", "cat_", "catarray")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "reduce")),
)


def kind_of(name: str) -> str:
    lowered = name.lower()
    for kind, patterns in KINDS:
        if any(pattern in lowered for pattern in patterns):
            return kind
    return "other"


def one_run(run: str, mode: str, norms: str, graphs: str, ll2_frames: int, top: int, reps: int) -> dict:
    if run == "sf13b":
        model, options, video_frames = random_real_model(), GenerationOptions(), 81
    else:
        model, options, video_frames = real_model(), options_for(ll2_frames, 8, 32, 8), 4 * ll2_frames - 3
    model.kernels = KernelSettings(fused_norms=norms == "fused", cuda_graphs=graphs == "on")
    if mode == "compiled":
        model.compile_blocks(dynamic=False)
    context = random_context()

    def generation() -> float:
        torch.cuda.synchronize()
        began = time.perf_counter()
        generate(model, context, options=options, seed=0)
        torch.cuda.synchronize()
        return time.perf_counter() - began

    generation()
    walls = sorted(generation() for _ in range(reps))
    wall = walls[len(walls) // 2]
    profile = profiled(generation)
    totals = kernel_totals(profile)
    kinds: dict[str, dict] = {}
    for name, (launches, ms) in totals.items():
        entry = kinds.setdefault(kind_of(name), {"launches": 0, "ms": 0.0})
        entry["launches"] += launches
        entry["ms"] += ms
    gpu_ms = sum(ms for _, ms in totals.values())
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])[:top]
    return {
        "run": run,
        "mode": mode,
        "norms": norms,
        "graphs": graphs,
        "wall_seconds": wall,
        "wall_seconds_runs": walls,
        "video_fps": video_frames / wall,
        "gpu_ms": gpu_ms,
        "gpu_busy_share": gpu_ms / 1000 / wall,
        "kinds": {kind: {"launches": e["launches"], "ms": round(e["ms"], 1)} for kind, e in sorted(kinds.items())},
        "top_kernels": [
            {"kernel": name[:140], "kind": kind_of(name), "launches": n, "ms": round(ms, 1)} for name, (n, ms) in ranked
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    parser.add_argument("--runs", default="sf13b,ll2", help="sf13b and/or ll2, comma-separated")
    parser.add_argument("--modes", default="eager,compiled", help="eager and/or compiled, comma-separated")
    parser.add_argument("--norms", default="fused,plain", help="fused and/or plain, comma-separated")
    parser.add_argument("--graphs", default="off", help="off and/or on, comma-separated: CUDA graphs")
    parser.add_argument("--ll2-frames", type=int, default=32, help="LongLive 2.0's latent frames")
    parser.add_argument("--reps", type=int, default=3, help="timed generations (median) after a warm-up")
    parser.add_argument("--top", type=int, default=25, help="kernels listed by GPU time")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": []}
    for run in args.runs.split(","):
        for mode in args.modes.split(","):
            for norms, graphs in itertools.product(args.norms.split(","), args.graphs.split(",")):
                try:
                    entry = one_run(run, mode, norms, graphs, args.ll2_frames, args.top, args.reps)
                except Exception as error:  # one failed variant keeps the others' rows
                    entry = {"run": run, "mode": mode, "norms": norms, "graphs": graphs}
                    entry["error"] = f"{type(error).__name__}: {error}"
                    torch.cuda.empty_cache()
                results["runs"].append(entry)
                (out / "eager-profile.json").write_text(json.dumps(results, indent=1))
                summary = {key: value for key, value in entry.items() if key != "top_kernels"}
                print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
