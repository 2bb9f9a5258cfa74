"""The model's attention kernels, cuDNN's and FlashAttention-4's (``capture.attention_kernel``).

The 1.3B's 21-frame generation is bound by its kernels, and cuDNN's attention is 57% of them
(docs/performance.md, "CUDA graphs over a call's layers"): 47 video FPS needs a faster
attention forward. ``flash-attn-4`` (``flash_attn.cute``, CuTe DSL, JIT-compiled for SM90 and
SM100; ``sinkscope.attention.flash4``) is the field's candidate. Two sections (``--sections``):

- ``call``: one attention call at the 1.3B's last block (12 heads x 4680 queries x 32760 keys)
  and LongLive 2.0's last chunk (24 x 7040 x 35200), random bf16, [1, L, H, D] as the model
  holds them. Rows: cuDNN alone; the model's call with cuDNN (``cached_attention``, the keys
  split as ``capture.kernels: fast`` splits them); FlashAttention-4 alone and in the model's
  call; with ``--tiles``, FlashAttention-4 at other key tiles, with and without its intra-
  warpgroup overlap. Each as ms a call with 20 queued, TFLOPS (4 L_q L_k D H flops), its error
  against a float64 reference over the first 512 queries (output and log-sum-exp), and the
  first FlashAttention-4 call's seconds (its JIT compile).
- ``generation`` (``--runs``): the 1.3B's 21-frame eager generation and LongLive 2.0's 32 frames
  (``capture.kernels: fast``, CUDA graphs on), ``attention_kernel`` cudnn and flash4 in
  alternating generations, ``--rounds`` each after two warm-ups; each side's median and video
  FPS, and how far apart their latents are.

Writes ``results.json`` to ``--out`` after every entry.

    PYTHONPATH=src python benchmarks/attention_backends.py --out $OUT
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from functools import partial
from importlib import metadata
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from frame_route import queued_ms  # noqa: E402

import sinkscope.attention.split as split  # noqa: E402
from report import error_entry, write_results  # noqa: E402
from sinkscope.attention.flash4 import flash4_forward  # noqa: E402
from sinkscope.attention.settings import KernelSettings  # noqa: E402

SHAPES = {
    "wan1.3b": dict(heads=12, num_q=4680, num_k=32760),
    "longlive2": dict(heads=24, num_q=7040, num_k=35200),
}
HEAD_DIM = 128
CHECKED_QUERIES = 512


def flash4_tiles(forward, tile_mn, overlap: bool):
    """FlashAttention-4's forward at a tile of its own choosing (for the sweep)."""

    def attend(q, k, v, scale):
        out, lse = forward(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            softmax_scale=scale,
            return_lse=True,
            tile_mn=tile_mn,
            intra_wg_overlap=overlap,
        )[:2]
        return out.transpose(1, 2), lse

    return attend


def reference(q, k, v, scale):
    """float64 (out [Lq, H, D], lse [H, Lq]) of the first CHECKED_QUERIES queries."""
    qd, kd, vd = (x[0].double().transpose(0, 1) for x in (q[:, :CHECKED_QUERIES], k, v))
    scores = qd @ kd.transpose(1, 2) * scale
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.softmax(scores, dim=-1) @ vd
    return out.transpose(0, 1), lse


def measure_shape(name: str, shape: dict, results: dict, out: str, forward, tiles) -> None:
    scale = HEAD_DIM**-0.5
    torch.manual_seed(0)
    heads, num_q, num_k = shape["heads"], shape["num_q"], shape["num_k"]
    q = torch.randn(1, num_q, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, num_k, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, num_k, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    views = [x.transpose(1, 2) for x in (q, k, v)]  # [N, H, L, D], as attention_with_lse takes them
    flops = 4 * num_q * num_k * HEAD_DIM * heads
    ref_out, ref_lse = reference(q, k, v, scale)
    results[f"{name}/key_split_plan"] = repr(split.key_split(q, k))
    rows = {
        "cudnn": lambda: split.attention_with_lse(*views, scale, "cudnn"),
        "model_call": lambda: split.cached_attention(q, k, v, kernel="cudnn"),
    }
    if forward is not None:
        began = time.perf_counter()
        split.attention_with_lse(*views, scale, "flash4")
        torch.cuda.synchronize()
        results[f"{name}/flash4_first_call_seconds"] = time.perf_counter() - began  # the JIT compile
        rows["flash4"] = lambda: split.attention_with_lse(*views, scale, "flash4")
        rows["flash4_key_split"] = lambda: split.cached_attention(q, k, v, kernel="flash4")
        for tile_mn, overlap in tiles:
            row = f"flash4_tile_{tile_mn[0]}x{tile_mn[1]}{'' if overlap else '_no_overlap'}"
            rows[row] = partial(flash4_tiles(forward, tile_mn, overlap), *views, scale)
    for row, fn in rows.items():
        key = f"{name}/{row}"
        try:
            result_out, result_lse = fn()
            if row in ("cudnn", "flash4") or row.startswith("flash4_tile"):
                result_out = result_out.transpose(1, 2)
            gpu_ms, host_ms = queued_ms(fn)
            results[key] = {
                "ms": gpu_ms,
                "host_ms": host_ms,
                "tflops": flops / gpu_ms / 1e9,
                "out_max_abs_error": (result_out[0, :CHECKED_QUERIES].double() - ref_out).abs().max().item(),
                "lse_max_abs_error": (result_lse[0, :, :CHECKED_QUERIES].double() - ref_lse).abs().max().item(),
            }
        except Exception as error:  # noqa: BLE001 - a failed row is reported, the rest still run
            results[key] = error_entry(error)
        print(key, results[key], flush=True)
        write_results(results, out, partial=True)
    base = results.get(f"{name}/model_call", {}).get("ms")
    for row in rows:
        entry = results.get(f"{name}/{row}", {})
        if base and "ms" in entry:
            entry["x_model_call"] = entry["ms"] / base


def call_section(results: dict, out: str, forward, tiles) -> None:
    for name, shape in SHAPES.items():
        measure_shape(name, shape, results, out, forward, tiles)
        torch.cuda.empty_cache()


def generation_section(results: dict, out: str, forward, rounds: int, runs: list[str]) -> None:
    from gpu_benchmark import random_context, random_real_model
    from longlive2_speed import options_for, real_model

    from sinkscope.generation.sampler import generate
    from sinkscope.options import GenerationOptions

    for run_name in runs:
        if run_name == "sf13b":
            model, options, video_frames = random_real_model(), GenerationOptions(), 81
        else:  # LongLive 2.0's procedure, 32 latent frames, chunks of 8, window 32 with an 8-frame sink
            model, options, video_frames = real_model(), options_for(32, 8, 32, 8), 4 * 32 - 3
        try:
            results[f"generation/{run_name}"] = paired_generations(
                model, random_context(), options, video_frames, forward, rounds, generate
            )
        except Exception as error:  # noqa: BLE001
            results[f"generation/{run_name}"] = error_entry(error)
        print(run_name, results[f"generation/{run_name}"], flush=True)
        write_results(results, out, partial=True)
        del model
        torch.cuda.empty_cache()


def paired_generations(model, context, options, video_frames: int, forward, rounds: int, generate) -> dict:
    """cuDNN and FlashAttention-4 (``KernelSettings.attention_kernel``) in alternating generations."""
    sides = ["cudnn"] + (["flash4"] if forward is not None else [])
    times: dict[str, list[float]] = {side: [] for side in sides}
    latents = {}

    def run(side: str) -> float:
        model.kernels = KernelSettings(attention_kernel=side)
        model.layer_graphs.clear()  # each generation captures its own graphs, as a job's does
        torch.cuda.synchronize()
        began = time.perf_counter()
        result = generate(model, context, options=options, seed=0)
        torch.cuda.synchronize()
        took = time.perf_counter() - began
        latents.setdefault(side, result.latents.float())
        return took

    for side in sides:  # warm-up: JIT compiles, the allocator
        run(side)
        run(side)
    for _ in range(rounds):
        for side in sides:
            times[side].append(run(side))
    entry = {
        side: {
            "seconds_median": statistics.median(t),
            "seconds": t,
            "video_fps": video_frames / statistics.median(t),
        }
        for side, t in times.items()
    }
    if "flash4" in latents:
        difference = (latents["flash4"] - latents["cudnn"]).norm() / latents["cudnn"].norm()
        entry["latents_relative_l2_flash4_vs_cudnn"] = difference.item()
        entry["cudnn_over_flash4"] = entry["cudnn"]["seconds_median"] / entry["flash4"]["seconds_median"]
    return entry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    parser.add_argument("--sections", default="call,generation")
    parser.add_argument("--rounds", type=int, default=4, help="timed generations a side")
    parser.add_argument("--runs", default="sf13b,ll2", help="generation section: sf13b and/or ll2")
    parser.add_argument("--tiles", default="", help="call section: FlashAttention-4 key tiles to sweep (128 x N)")
    args = parser.parse_args()
    forward = flash4_forward()
    tiles = [((128, n), overlap) for n in (int(x) for x in args.tiles.split(",") if x) for overlap in (True, False)]
    results: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "flash_attn_4": None if forward is None else metadata.version("flash-attn-4"),
    }
    sections = args.sections.split(",")
    if "call" in sections:
        call_section(results, args.out, forward, tiles)
    if "generation" in sections:
        generation_section(results, args.out, forward, args.rounds, args.runs.split(","))
    return write_results(results, args.out)


if __name__ == "__main__":
    sys.exit(main())
