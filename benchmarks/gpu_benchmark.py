"""GPU benchmark of sinkscope at the Wan2.1-T2V-1.3B size (random bf16 weights).

Sections (``--sections``, comma-separated; default all):

- ``env``: device, versions, measured bf16 matmul and copy ceilings.
- ``stats``: one statistics call at the last block's shape (12 heads, 4680 queries,
  32760 keys, head_dim 128, bf16) against the SDPA call and the seed notebooks'
  materialize-and-loop method; accuracy against the float32 and float64 references;
  extra GPU memory; the Triton config sweep.
- ``fused``: the captured call: SDPA then the statistics (before) against
  ``attention_frame_partials_kernel``, the output and every frame statistic from one
  pass over the keys; with token profiles;
  the output's accuracy against SDPA and float64; its tile sweep.
- ``generation``: the full 21-frame generation (7 blocks x (4 steps + cache pass)),
  eager and torch.compile'd, with no capture, one layer and all 30 layers captured
  (`capture.attention` exact, the default, and fused):
  video frames per second (81 / seconds), overhead, peak GPU memory, KV cache size.
- ``job``: one extraction job end to end in a fresh process (start-up, weights from a
  Wan-format release folder, generation, writing), for 1 and for 30 layers per job.
- ``handoff``: where a 30-layer job's generation loses time to its writing (warm, in
  one process): records kept on the device, only copied to the host, or written by the
  extraction writer's threads.
- ``warmup``: where a fresh process's first generation loses time, per SDPA backend:
  first and second generation in new processes, with the slowest calls of the first.
- ``tma``: ``attention_frame_partials_tma_kernel``, a flash-attention forward in Triton fed by TMA, plain and with every
  frame's partials, warp-specialized or not, against cuDNN and the captured call's other
  routes, at the last and the first block's shape (its tile sweep).
- ``rollouts``: every policy of issue 18 at ``--frames`` (240) latent frames with one
  layer captured, in the mode a job runs by default, and the peak memory from 21 to 480
  frames (``benchmarks/long_rollout.py``'s sections).

The default sections (env, fused, generation, job, rollouts) measure every target of
issue 18 in one call; ``results.md`` opens with a table of them, met or missed.

Writes ``results.json`` and ``results.md`` to ``--out`` (default: $OUT or ./benchmark-out)
and prints the tables. Usage on the device machine:

    PYTHONPATH=src python benchmarks/gpu_benchmark.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from sinkscope.attention.settings import KernelSettings  # noqa: E402
from sinkscope.generation.capture import FRAME_STAT_NAMES, FrameStatsCapture  # noqa: E402
from sinkscope.generation.sampler import generate  # noqa: E402
from sinkscope.model import build_model, get_model_config, init_random_weights  # noqa: E402
from sinkscope.options import GenerationOptions  # noqa: E402
from sinkscope.stats.attention import attention_statistics  # noqa: E402
from sinkscope.stats.reference import logit_mean_factorized, statistics_chunked  # noqa: E402

MiB = 2**20
GiB = 2**30


def frame_stats(q, k, *, frame_seq_length, query_frames, key_frames, backend="auto"):
    """(logit_mean, prob_mass) of one call: the frame statistics the first benchmark rows compare."""
    stats = attention_statistics(
        q, k, frame_seq_length=frame_seq_length, query_frames=query_frames, key_frames=key_frames, backend=backend
    )
    return stats.logit_mean, stats.prob_mass


def cuda_time(fn, reps: int = 20, warmup: int = 3) -> dict:
    """Median/min/max milliseconds of fn() with CUDA events, after warm-up."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return {"median_ms": times[len(times) // 2], "min_ms": times[0], "max_ms": times[-1], "reps": reps}


def extra_memory(fn) -> float:
    """Peak GPU memory above what was allocated before the call, in MiB."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out
    return (peak - before) / MiB


# -- env -----------------------------------------------------------------------------------


def section_env() -> dict:
    import triton

    info = {
        "device": torch.cuda.get_device_name(),
        "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": sys.version.split()[0],
    }
    try:
        smi = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
        info["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    matmul = cuda_time(lambda: a @ b, reps=10)  # noqa: F821 (the del below, after the call, confuses ruff)
    info["bf16_matmul_tflops"] = 2 * 8192**3 / (matmul["median_ms"] * 1e-3) / 1e12
    src = torch.empty(2 * GiB // 2, device="cuda", dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    copy = cuda_time(lambda: dst.copy_(src), reps=10)  # noqa: F821 (the del below, after the call, confuses ruff)
    info["copy_tb_s"] = 2 * src.numel() * 2 / (copy["median_ms"] * 1e-3) / 1e12
    del a, b, src, dst
    torch.cuda.empty_cache()
    return info


# -- one statistics call -----------------------------------------------------------------


def last_block_inputs(heads=12, num_q=3, num_k=21, fsl=1560, dim=128, seed=0, q_scale=1.0):
    """q and k laid out as the model holds them ([1, L, H, D] views), with per-frame offsets."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(1, num_q * fsl, heads, dim, device="cuda", generator=g) * q_scale
    q += 0.5 * torch.randn(1, num_q, 1, heads, dim, device="cuda", generator=g).repeat_interleave(fsl, 1).flatten(1, 2)
    k = torch.randn(1, num_k * fsl, heads, dim, device="cuda", generator=g)
    k += 0.5 * torch.randn(1, num_k, 1, heads, dim, device="cuda", generator=g).repeat_interleave(fsl, 1).flatten(1, 2)
    v = torch.randn(1, num_k * fsl, heads, dim, device="cuda", generator=g)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def naive_materialize_and_loop(q, k, fsl, num_q, num_k, scale):
    """The seed notebooks' method: fp32 logits, softmax, then a loop over frame slices with .item()."""
    logits = torch.matmul(q.float(), k.float().transpose(1, 2)) * scale
    probs = torch.softmax(logits, dim=-1)
    heads = q.shape[0]
    logit = torch.empty(heads, num_q, num_k)
    mass = torch.empty(heads, num_q, num_k)
    for h in range(heads):
        for a in range(num_q):
            for b in range(num_k):
                rows, cols = slice(a * fsl, (a + 1) * fsl), slice(b * fsl, (b + 1) * fsl)
                logit[h, a, b] = logits[h, rows, cols].mean().item()
                mass[h, a, b] = probs[h, rows, cols].sum(-1).mean().item()
    return logit, mass


def float64_reference(q, k, fsl, num_q, num_k, scale, heads=(0, 5, 11)):
    """Exact float64 statistics of a few heads (full logits, one head at a time)."""
    out = []
    for h in heads:
        s = torch.matmul(q[h].double(), k[h].double().T) * scale
        p = torch.softmax(s, dim=-1)
        logit = s.view(num_q, fsl, num_k, fsl).mean(dim=(1, 3))
        mass = p.view(num_q, fsl, num_k, fsl).sum(-1).mean(1)
        out.append((h, logit.float(), mass.float()))
        del s, p
    return out


def section_stats() -> dict:
    from sinkscope.stats.launch import _CONFIGS, statistics_triton

    fsl, num_q, num_k, dim = 1560, 3, 21, 128
    scale = dim**-0.5
    frames_q, frames_k = list(range(18, 21)), list(range(21))
    q4, k4, v4 = last_block_inputs()
    q, k = q4[0].transpose(0, 1), k4[0].transpose(0, 1)  # [H, L, D] views, as the capture passes them
    results: dict = {
        "shape": {"heads": 12, "queries": num_q * fsl, "keys": num_k * fsl, "head_dim": dim, "dtype": "bfloat16"}
    }

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(
            q4.transpose(1, 2), k4.transpose(1, 2), v4.transpose(1, 2)
        )

    def ours():
        return frame_stats(q, k, frame_seq_length=fsl, query_frames=frames_q, key_frames=frames_k)

    def torch_logit():
        return logit_mean_factorized(q, k, num_q, num_k, scale, torch.float32)

    def torch_chunked():
        return statistics_chunked(q, k, fsl, num_q, (fsl,) * num_k, scale).prob_mass

    rows = {}
    for name, fn, reps in (
        ("SDPA (default backend), the attention call itself", sdpa, 30),
        ("sinkscope attention_statistics: Triton kernel, every frame statistic", ours, 30),
        ("torch path on the GPU: logit_mean by factorization", torch_logit, 50),
        ("torch path on the GPU: prob_mass by chunked fp32 softmax", torch_chunked, 5),
    ):
        rows[name] = {**cuda_time(fn, reps=reps), "extra_mib": extra_memory(fn)}
    began = time.perf_counter()
    naive = naive_materialize_and_loop(q, k, fsl, num_q, num_k, scale)
    torch.cuda.synchronize()
    naive_ms = (time.perf_counter() - began) * 1e3
    rows["seed notebooks: fp32 logits + softmax + 252x2 slice loop"] = {
        "median_ms": naive_ms,
        "min_ms": naive_ms,
        "max_ms": naive_ms,
        "reps": 1,
        "extra_mib": extra_memory(
            lambda: torch.softmax(torch.matmul(q.float(), k.float().transpose(1, 2)) * scale, -1)
        ),
    }
    torch.cuda.empty_cache()
    base = rows["SDPA (default backend), the attention call itself"]["median_ms"]
    for row in rows.values():
        row["x_sdpa"] = row["median_ms"] / base
    results["timings"] = rows

    # Accuracy: against the float32 torch reference (all heads) and float64 (3 heads).
    logit, mass = ours()
    ref_logit = logit_mean_factorized(q, k, num_q, num_k, scale, torch.float64).float()
    ref_mass = torch_chunked()
    accuracy = {
        "logit_mean_vs_fp64_factorization": (logit - ref_logit).abs().max().item(),
        "prob_mass_vs_torch_fp32": (mass - ref_mass).abs().max().item(),
        "prob_mass_rows_sum_to_1": (mass.sum(-1) - 1).abs().max().item(),
        "naive_vs_ours_logit": (naive[0] - logit.cpu()).abs().max().item(),
        "naive_vs_ours_mass": (naive[1] - mass.cpu()).abs().max().item(),
    }
    worst_logit = worst_mass = 0.0
    for h, l64, m64 in float64_reference(q, k, fsl, num_q, num_k, scale):
        worst_logit = max(worst_logit, (logit[h] - l64).abs().max().item())
        worst_mass = max(worst_mass, (mass[h] - m64).abs().max().item())
    accuracy["logit_mean_vs_fp64_full"] = worst_logit
    accuracy["prob_mass_vs_fp64_full"] = worst_mass
    results["accuracy"] = accuracy
    results["ranges"] = {
        "logit_mean": [logit.min().item(), logit.max().item()],
        "prob_mass": [mass.min().item(), mass.max().item()],
    }

    # A sliding window with sinks: 2 sink frames + 10 recent frames, non-contiguous key frames.
    window_k = [0, 1] + list(range(11, 21))
    kw = k4[:, : len(window_k) * fsl][0].transpose(0, 1)
    got = frame_stats(q, kw, frame_seq_length=fsl, query_frames=frames_q, key_frames=window_k)
    ref = frame_stats(q, kw, frame_seq_length=fsl, query_frames=frames_q, key_frames=window_k, backend="torch")
    results["accuracy"]["window_with_sinks_vs_torch"] = max((a - b).abs().max().item() for a, b in zip(got, ref))

    sweep = tile_sweep(
        lambda params: statistics_triton(q, k, fsl, num_q, (fsl,) * num_k, scale, config=params),
        [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in _CONFIGS],
    )
    results["triton_sweep_ms"] = sweep
    return results


# -- generation ------------------------------------------------------------------------------


def tile_sweep(run, configs) -> dict:
    """Median ms of ``run(params)`` per (BLOCK_M, BLOCK_N, warps, stages) of ``configs``."""
    sweep = {}
    for block_m, block_n, warps, stages in configs:
        params = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages}
        label = f"BLOCK_M={block_m} BLOCK_N={block_n} warps={warps} stages={stages}"
        try:
            sweep[label] = cuda_time(lambda params=params: run(params), reps=20)["median_ms"]
        except Exception as error:  # noqa: BLE001 - report, keep going
            sweep[label] = f"failed: {str(error)[:200]}"
    return sweep


def output_accuracy(out, reference, q, k, v, heads=(0, 5, 11)) -> dict:
    """Max abs errors of a captured call's output [Lq, H, D] against SDPA's (``reference``)
    and, for a few heads, both against the float64 attention."""
    exact = torch.stack(
        [torch.softmax(q[h].double() @ k[h].double().T * q.shape[-1] ** -0.5, -1) @ v[h].double() for h in heads], 1
    )
    return {
        "output_vs_sdpa_max_abs": (out.float() - reference.float()).abs().max().item(),
        "output_vs_fp64_max_abs_3_heads": (out[:, list(heads)].double() - exact).abs().max().item(),
        "sdpa_vs_fp64_max_abs_3_heads": (reference[:, list(heads)].double() - exact).abs().max().item(),
        "output_abs_max": reference.float().abs().max().item(),
    }


# The kernels every model of this run computes with (--no-key-split turns the split off).
KERNELS = KernelSettings()
SDPA_ROW = "SDPA (default backend), the attention call itself"
EXACT_ROW = (
    "capture.attention: exact (the default): cuDNN attention + log-sum-exp, then frame_partials_given_lse_kernel: "
    "every frame statistic"
)
FUSED_ROW = (
    "capture.attention: fused: attention_frame_partials_tma_kernel + frame_statistics_combine_kernel, output and "
    "every frame statistic in one pass"
)


def section_fused() -> dict:
    """The captured call: SDPA then the statistics (before) against the routes that give the
    output and every frame statistic (capture.attention exact, the default: cuDNN with its
    log-sum-exp, then frame_partials_given_lse_kernel; fused: the TMA pass + the combine;
    float32's attention_frame_partials_kernel + the combine);
    token profiles on top; tile sweeps. Accuracy: ``output_*`` and the statistics are the
    fused route's, ``lse_route_*`` the exact route's."""
    from sinkscope.stats.attention import (
        attention_statistics,
        attention_with_statistics,
    )
    from sinkscope.stats.launch import (
        attention_statistics_lse,
        attention_statistics_triton,
        sdpa_with_lse,
    )

    fsl, num_q, num_k, dim = 1560, 3, 21, 128
    frames_q, frames_k = list(range(18, 21)), list(range(21))
    q4, k4, v4 = last_block_inputs()
    q, k, v = (x[0].transpose(0, 1) for x in (q4, k4, v4))  # [H, L, D] views, as the capture passes them
    layout = dict(frame_seq_length=fsl, query_frames=frames_q, key_frames=frames_k)

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(
            q4.transpose(1, 2), k4.transpose(1, 2), v4.transpose(1, 2)
        )

    def before():
        sdpa()
        return attention_statistics(q, k, **layout)

    def before_tokens():
        sdpa()
        return attention_statistics(q, k, token_profiles=True, **layout)

    def fused():
        return attention_with_statistics(q, k, v, fused=True, **layout)

    def fused_tokens():
        return attention_with_statistics(q, k, v, token_profiles=True, fused=True, **layout)

    def exact():
        return attention_with_statistics(q, k, v, **layout)

    def exact_tokens():
        return attention_with_statistics(q, k, v, token_profiles=True, **layout)

    def one_pass():
        return attention_statistics_triton(q, k, v, fsl, num_q, (fsl,) * num_k, dim**-0.5)

    rows = {}
    for name, fn in (
        (SDPA_ROW, sdpa),
        ("before: SDPA, then attention_statistics (frame_softmax_partials_kernel + combine)", before),
        (EXACT_ROW, exact),
        (FUSED_ROW, fused),
        ("cuDNN attention with its log-sum-exp", lambda: sdpa_with_lse(q, k, v, dim**-0.5)),
        ("attention_frame_partials_kernel (Triton, pointer loads) + combine: every frame statistic", one_pass),
        ("before, with token profiles (+ token_profiles_kernel)", before_tokens),
        ("exact, with token profiles (+ token_profiles_kernel)", exact_tokens),
        ("fused, with token profiles (+ token_profiles_kernel)", fused_tokens),
    ):
        rows[name] = {**cuda_time(fn, reps=30), "extra_mib": extra_memory(fn)}
    base = rows[SDPA_ROW]["median_ms"]
    for row in rows.values():
        row["x_sdpa"] = row["median_ms"] / base
    out, stats = fused()
    reference = sdpa().transpose(1, 2)[0]  # [Lq, H, D]
    accuracy = output_accuracy(out, reference, q, k, v)
    plain = attention_statistics(q, k, token_profiles=True, **layout)
    lse_out, lse_stats = attention_statistics_lse(q, k, v, fsl, num_q, (fsl,) * num_k, dim**-0.5, token_profiles=True)
    accuracy["lse_route_output_vs_sdpa_max_abs"] = (lse_out.float() - reference.float()).abs().max().item()
    for name in ("logit_mean", "prob_mass", "argmax_share", "entropy"):
        accuracy[f"{name}_vs_frame_softmax_partials_max_abs"] = (
            (getattr(stats, name) - getattr(plain, name)).abs().max().item()
        )
    for name in ("logit_mean", "prob_mass", "argmax_share", "entropy", "token_prob_mean", "token_logit_mean"):
        accuracy[f"lse_route_{name}_vs_frame_softmax_partials_max_abs"] = (
            (getattr(lse_stats, name) - getattr(plain, name)).abs().max().item()
        )
    sweep = tile_sweep(
        lambda params: attention_statistics_triton(q, k, v, fsl, num_q, (fsl,) * num_k, dim**-0.5, config=params),
        (
            (128, 64, 8, 3),
            (128, 64, 8, 2),
            (128, 128, 8, 2),
            (64, 64, 4, 3),
            (64, 128, 4, 3),
            (128, 32, 4, 3),
            (64, 64, 4, 4),
        ),
    )
    # frame_partials_given_lse_kernel alone (the log-sum-exp given), the statistics pass of the default route.
    from sinkscope.stats.launch import statistics_given_lse

    lse = sdpa_with_lse(q, k, v, dim**-0.5)[1]
    sweep_4 = tile_sweep(
        lambda params: statistics_given_lse(q, k, lse, fsl, num_q, (fsl,) * num_k, dim**-0.5, config=params),
        (
            (128, 64, 8, 3),
            (128, 64, 8, 4),
            (128, 128, 8, 3),
            (128, 128, 8, 2),
            (64, 128, 4, 3),
            (64, 64, 4, 3),
            (256, 64, 8, 3),
        ),
    )
    return {"timings": rows, "accuracy": accuracy, "one_pass_sweep_ms": sweep, "given_lse_sweep_ms": sweep_4}


def section_tma() -> dict:
    """attention_frame_partials_tma_kernel (TMA loads, key tiles aligned to key 0): as a plain flash-attention forward
    and with every frame's partials, against cuDNN and the captured call's other routes, at
    the last block's and the first block's shape; its tile sweep and its accuracy."""
    from sinkscope.stats.launch import (
        _combine_fused,
        attention_statistics_lse,
        attention_statistics_tma,
        sdpa_with_lse,
        tma_attention,
    )
    from sinkscope.stats.reductions import segment_part_sums

    fsl, dim = 1560, 128
    configs = (
        (64, 64, 4, 3),
        (128, 128, 8, 3),
        (128, 64, 8, 3),
        (64, 64, 4, 2),
        (64, 64, 4, 4),
        (64, 32, 4, 3),
        (64, 128, 4, 3),
        (64, 64, 8, 3),
    )
    result: dict = {}
    for shape, num_k in (("last block", 21), ("first block", 3)):
        q4, k4, v4 = last_block_inputs(num_k=num_k)
        q, k, v = (x[0].transpose(0, 1) for x in (q4, k4, v4))
        lengths = (fsl,) * num_k

        def sdpa():
            return torch.nn.functional.scaled_dot_product_attention(
                q4.transpose(1, 2), k4.transpose(1, 2), v4.transpose(1, 2)
            )

        rows = {
            "SDPA (default backend)": cuda_time(sdpa, reps=30)["median_ms"],
            "cuDNN with log-sum-exp": cuda_time(lambda: sdpa_with_lse(q, k, v, dim**-0.5), reps=30)["median_ms"],
            "cuDNN + frame_partials_given_lse_kernel + combine": cuda_time(
                lambda: attention_statistics_lse(q, k, v, fsl, 3, lengths, dim**-0.5), reps=30
            )["median_ms"],
            "TMA pass + combine, default tiles": cuda_time(
                lambda: attention_statistics_tma(q, k, v, fsl, 3, lengths, dim**-0.5), reps=30
            )["median_ms"],
        }
        # The parts of the TMA route: the kernel, the key frames' sums, the combine (with logit_mean).
        _, partials = tma_attention(q, k, v, lengths, dim**-0.5)
        key_sums = segment_part_sums(k, lengths)
        lengths_float = torch.tensor(lengths, dtype=torch.float32, device="cuda")
        rows["part: attention_frame_partials_tma_kernel (default tiles)"] = cuda_time(
            lambda: tma_attention(q, k, v, lengths, dim**-0.5), reps=30
        )["median_ms"]
        rows["part: segment_sums_kernel, key frames' sums"] = cuda_time(lambda: segment_part_sums(k, lengths), reps=30)[
            "median_ms"
        ]
        rows["part: frame_statistics_combine_kernel, the combine and logit_mean"] = cuda_time(
            lambda: _combine_fused(q, k, partials, key_sums, lengths_float, fsl, 3, dim**-0.5, False, None), reps=30
        )["median_ms"]
        base = rows["SDPA (default backend)"]
        entry = {"ms": rows, "x_sdpa": {name: ms / base for name, ms in rows.items()}}
        for label, stats_on, specialize in (
            ("plain", False, False),
            ("plain_warp_specialized", False, True),
            ("stats", True, False),
            ("stats_warp_specialized", True, True),
        ):
            entry[f"{label}_sweep_ms"] = tile_sweep(
                lambda params, stats_on=stats_on, specialize=specialize: tma_attention(
                    q, k, v, lengths, dim**-0.5, stats=stats_on, warp_specialize=specialize, config=params
                ),
                configs if not specialize else configs[:4],
            )
        out, stats = attention_statistics_tma(q, k, v, fsl, 3, lengths, dim**-0.5, token_profiles=True)
        ref_out, ref_stats = attention_statistics_lse(q, k, v, fsl, 3, lengths, dim**-0.5, token_profiles=True)
        accuracy = output_accuracy(out, ref_out, q, k, v)
        for name in ("logit_mean", "prob_mass", "argmax_share", "entropy", "token_prob_mean", "token_logit_mean"):
            accuracy[f"{name}_vs_given_lse_max_abs"] = (
                (getattr(stats, name) - getattr(ref_stats, name)).abs().max().item()
            )
        entry["accuracy"] = accuracy
        result[shape] = entry
        print(shape, json.dumps(entry, indent=1), flush=True)
    return result


def random_real_model(name: str = "wan2.1-t2v-1.3b"):
    with torch.device("cuda"):
        model = build_model(get_model_config(name), seed=None, device="cuda", dtype=torch.float32)
    init_random_weights(model, seed=0, device="cuda")
    model.kernels = KERNELS
    return model.to(torch.bfloat16)


def random_context(tokens: int = 24, text_dim: int = 4096) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(1)
    return torch.randn(1, tokens, text_dim, device="cuda", generator=g)


def time_generation(
    model, context, options, layers, reps, attention="exact", chosen=FRAME_STAT_NAMES, token_profiles="last_block"
):
    """Median seconds over ``reps`` generations (after one warm-up), and the peak memory
    (``token_profiles``: ``capture.token_profiles``, a job's default ``last_block``).

    ``seconds_*`` count the generation and the rows' collection (``capture.to_frame``: the
    statistics to the host, one DataFrame); ``generation_seconds_median`` and
    ``collect_seconds_median`` are the two parts. An extraction job collects while the
    next block generates (``ExtractionWriter``), so the first part is what it waits for."""
    seconds, generation_seconds, collect_seconds, peak, latents, rows = [], [], [], 0, None, None
    for rep in range(reps + 1):
        torch.cuda.empty_cache()
        if layers:
            with FrameStatsCapture(
                model,
                layers,
                frame_seq_length=1560,
                attention=attention,
                statistics=chosen,
                token_profiles=token_profiles,
            ) as capture:
                result = generate(model, context, options=options, seed=0, observers=[capture])
                began = time.perf_counter()
                frame = capture.to_frame()
                collect = time.perf_counter() - began
            rows = len(frame)
        else:
            result = generate(model, context, options=options, seed=0)
            collect = 0.0
        if rep == 0:
            first = result.seconds
            continue
        seconds.append(result.seconds + collect)
        generation_seconds.append(result.seconds)
        collect_seconds.append(collect)
        peak = max(peak, result.peak_memory_bytes)
        latents = result.latents
    seconds.sort()
    median = seconds[len(seconds) // 2]
    return {
        "seconds_median": median,
        "seconds_min": seconds[0],
        "seconds_max": seconds[-1],
        "first_run_seconds": first,
        "generation_seconds_median": statistics.median(generation_seconds),
        "collect_seconds_median": statistics.median(collect_seconds),
        "video_fps": 81 / median,
        "peak_gib": peak / GiB,
        "rows": rows,
        "latents_finite": bool(torch.isfinite(latents).all()),
        "kv_cache_gib": result.kv_cache_bytes / GiB,
    }, latents


def section_generation(reps: int, compile_modes: list[str]) -> dict:
    options = GenerationOptions()
    model = random_real_model()
    context = random_context()
    results = {"weights_gib": sum(p.numel() * p.element_size() for p in model.parameters()) / GiB}
    # Keys: label -> (layers, capture.attention, capture.statistics[, capture.token_profiles]).
    frames_only = ("logit_mean", "prob_mass")
    no_entropy = ("logit_mean", "prob_mass", "argmax_share")
    captures = {
        "no capture": ([], "exact", FRAME_STAT_NAMES),
        "1 layer (layer 4)": ([4], "exact", FRAME_STAT_NAMES),
        "all 30 layers": (list(range(30)), "exact", FRAME_STAT_NAMES),
        "1 layer (layer 4), fused": ([4], "fused", FRAME_STAT_NAMES),
        "all 30 layers, fused": (list(range(30)), "fused", FRAME_STAT_NAMES),
        "all 30 layers, frames": (list(range(30)), "frames", frames_only),
        "all 30 layers, exact, logit_mean only": (list(range(30)), "exact", ("logit_mean",)),
        "all 30 layers, exact, no entropy": (list(range(30)), "exact", no_entropy),
        "all 30 layers, no token profiles": (list(range(30)), "exact", FRAME_STAT_NAMES, "none"),
        "all 30 layers, exact, no entropy, no token profiles": (list(range(30)), "exact", no_entropy, "none"),
    }
    if only := os.environ.get("SINKSCOPE_BENCH_CAPTURES"):
        captures = {label: row for label, row in captures.items() if label in only.split(";")}
    reference = None
    for mode in compile_modes:
        if mode == "compile":
            began = time.perf_counter()
            model.compile_blocks(dynamic=False)
            results["compile_setup_seconds"] = time.perf_counter() - began
        for label, (layers, *capture_args) in captures.items():
            key = f"{mode}, {label}"
            try:
                results[key], latents = time_generation(model, context, options, layers, reps, *capture_args)
            except Exception as error:  # noqa: BLE001 - report, keep going
                results[key] = {
                    "error": f"{type(error).__name__}: {error}",
                    "traceback": traceback.format_exc()[-2000:],
                }
                continue
            if reference is None:
                reference = latents.float()
            else:
                results[key]["latents_rel_diff_vs_first"] = (
                    (latents.float() - reference).norm() / reference.norm()
                ).item()
        base = results.get(f"{mode}, no capture", {}).get("seconds_median")
        for label in captures:
            row = results.get(f"{mode}, {label}", {})
            if base and "seconds_median" in row:
                row["overhead_pct"] = 100 * (row["seconds_median"] / base - 1)
                row["extra_peak_mib"] = (row["peak_gib"] - results[f"{mode}, no capture"]["peak_gib"]) * 1024
    del model
    torch.cuda.empty_cache()
    return results


def section_handoff(reps: int) -> dict:
    """Where a 30-layer job's generation loses time to its writing: warm, in one process,
    eager, the same generation with its records (a) kept on the device, (b) copied to
    pinned host memory and dropped (the hand-over alone), (c) handed to the extraction
    writer (4 threads: rows built and written while the video is generated). Seconds of
    the generation (median), and of ``finish`` after it for (c)."""
    from sinkscope.generation.capture import record_tensors
    from sinkscope.pipeline.writing import ExtractionWriter, HostCopy

    options = GenerationOptions()
    model = random_real_model()
    context = random_context()
    layers = list(range(30))
    run_columns = {"checkpoint": "bench", "variant": "default", "prompt_id": "p", "seed": 0}
    results: dict = {}

    def kept():
        with FrameStatsCapture(model, layers, frame_seq_length=1560) as capture:
            return generate(model, context, options=options, seed=0, observers=[capture]).seconds, 0.0

    def copied():
        copies = []
        handoff = lambda record: copies.append(HostCopy(record_tensors(record, 1560)))  # noqa: E731
        with FrameStatsCapture(model, layers, frame_seq_length=1560, handoff=handoff) as capture:
            seconds = generate(model, context, options=options, seed=0, observers=[capture]).seconds
        began = time.perf_counter()
        for copy in copies:
            copy.arrays()
        return seconds, time.perf_counter() - began

    def written(workers: int, switch_interval: float | None = None):
        default_interval = sys.getswitchinterval()
        if switch_interval is not None:
            sys.setswitchinterval(switch_interval)
        try:
            with tempfile.TemporaryDirectory() as folder:
                writer = ExtractionWriter(
                    folder, layers, frame_seq_length=1560, run_columns=run_columns, workers=workers
                )
                with FrameStatsCapture(model, layers, frame_seq_length=1560, handoff=writer.submit) as capture:
                    seconds = generate(model, context, options=options, seed=0, observers=[capture]).seconds
                began = time.perf_counter()
                writer.finish({"package_version": "bench"})
                return seconds, time.perf_counter() - began
        finally:
            sys.setswitchinterval(default_interval)

    variants = {
        "no capture": lambda: (generate(model, context, options=options, seed=0).seconds, 0.0),
        "records kept on the device": kept,
        "host copies only": copied,
        **{f"extraction writer, {n} threads": (lambda n=n: written(n)) for n in (1, 2, 4)},
        "extraction writer, 4 threads, GIL switch interval 0.5 ms": lambda: written(4, 0.0005),
    }
    for label, run in variants.items():
        runs = [run() for _ in range(reps + 1)][1:]  # the first is a warm-up
        generation = sorted(r[0] for r in runs)
        after = sorted(r[1] for r in runs)
        results[label] = {
            "generation_seconds_median": generation[len(generation) // 2],
            "generation_seconds": generation,
            "after_seconds_median": after[len(after) // 2],
        }
    return results  # the model goes with the closures


# -- one extraction job end to end ---------------------------------------------------------


JOB_DRIVER = """
import json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, {src!r})
from sinkscope.pipeline.extract import extract_job
t1 = time.perf_counter()
meta = extract_job(checkpoint={checkpoint!r}, variant="default", prompt_id="eagle", seed=0, layers={layers!r},
                   output={out!r}, embedding={embedding!r}, weights_sha256="benchmark", generation={{}},
                   capture={{"backend": "auto", "attention": "exact", "kernels": "fast", "compile": {compile!r},
                            "token_profiles": "last_block"}},
                   compute={{"device": "cuda", "dtype": "bfloat16"}})
t2 = time.perf_counter()
print("RESULT " + json.dumps({{"import_seconds": t1 - t0, "job_seconds": t2 - t1, "timings": meta["timings"]}}))
"""


def write_release_folder(folder: Path) -> float:
    """A Wan2.1-T2V-1.3B release folder with random fp32 weights (as the release: fp32)."""
    from safetensors.torch import save_file

    config = get_model_config("wan2.1-t2v-1.3b")
    folder.mkdir(parents=True, exist_ok=True)
    fields = ("dim", "ffn_dim", "freq_dim", "in_dim", "out_dim", "num_heads", "num_layers", "eps", "text_len")
    (folder / "config.json").write_text(
        json.dumps({"_class_name": "WanModel", "model_type": "t2v", **{f: getattr(config, f) for f in fields}})
    )
    model = random_real_model()
    state = {k: v.float().cpu().contiguous() for k, v in model.state_dict().items()}
    del model
    torch.cuda.empty_cache()
    began = time.perf_counter()
    save_file(state, str(folder / "diffusion_pytorch_model.safetensors"))
    return time.perf_counter() - began


def run_job(workdir: Path, release: Path, layers: list[int], compile: bool, cache_dir: Path | None = None) -> dict:
    """One extraction job in a fresh process."""
    from sinkscope.model.text import TextEncoderSpec, save_embedding

    embedding = workdir / "eagle.safetensors"
    if not embedding.exists():
        save_embedding(
            embedding,
            random_context()[0].cpu(),
            prompt="benchmark",
            encoder=TextEncoderSpec("umt5", "wan", str(release)),
        )
    checkpoint = {
        "name": "bench",
        "model": None,
        "format": "wan",
        "weights": str(release),
        "base": None,
        "seed": 0,
        "ema": True,
        "allow_pickle": False,
        "dtype": "bfloat16",
        "train_step": None,
    }
    out = workdir / f"out-{len(layers)}-{compile}"
    script = JOB_DRIVER.format(
        src=str(ROOT / "src"),
        checkpoint=checkpoint,
        layers=layers,
        out=str(out),
        embedding=str(embedding),
        compile=compile,
    )
    began = time.perf_counter()
    env = dict(os.environ)
    if cache_dir is not None:  # compile caches of this job only (cold, then warm)
        env.update(TORCHINDUCTOR_CACHE_DIR=str(cache_dir / "inductor"), TRITON_CACHE_DIR=str(cache_dir / "triton"))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900, env=env)
    wall = time.perf_counter() - began
    if proc.returncode:
        return {"error": proc.stderr[-3000:]}
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    return {"wall_seconds": wall, **result, "output_mib": sum(p.stat().st_size for p in out.glob("*.parquet")) / MiB}


def section_jobs(workdir: Path, compile_modes: list[str]) -> dict:
    release = workdir / "Wan2.1-T2V-1.3B"
    results = {"write_release_seconds": write_release_folder(release)}
    all_layers = list(range(30))
    results["eager, 1 layer per job"] = run_job(workdir, release, [4], False)
    results["eager, 30 layers per job"] = run_job(workdir, release, all_layers, False)
    if "compile" in compile_modes:
        caches = workdir / "compile-cache"
        results["compile, 30 layers per job, cold compile cache"] = run_job(workdir, release, all_layers, True, caches)
        # A second compiled job reuses the on-disk Inductor and Triton caches.
        results["compile, 30 layers per job, warm compile cache"] = run_job(workdir, release, all_layers, True, caches)
    return results


def section_rollouts(frames: int = 240, memory_frames: tuple[int, ...] = (21, 480)) -> dict:
    """Every target policy of issue 18 at ``frames`` latent frames with one layer captured, in
    the mode a job runs by default (``capture.compile: auto``), and the peak memory of one
    bounded policy from 21 to ``memory_frames[-1]`` frames (``benchmarks/long_rollout.py``'s
    sections, run here so that one call measures every target)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import long_rollout

    from sinkscope.pipeline.extract import compile_wanted

    long_rollout.KERNELS = KERNELS
    model = long_rollout.real_model()
    compiled = compile_wanted("auto", torch.device("cuda"), frames, KERNELS.fused_norms)
    if compiled:
        out = long_rollout.section_compiled(model, frames)
    else:
        out = long_rollout.section_policies(model, frames, long_rollout.TARGET_POLICIES)
    out["default_mode"] = "compiled" if compiled else "eager"
    out["frames"] = frames
    out["memory"] = long_rollout.section_memory(model, lengths=memory_frames)
    del model
    torch.cuda.empty_cache()
    return out


def targets_table(results: dict) -> list[str]:
    """Issue 18's targets against this run's numbers, one row each (rows whose section did
    not run are left out)."""
    rows = []
    fused = results.get("fused", {}).get("timings", {})
    sdpa = fused.get(SDPA_ROW, {}).get("median_ms")
    for label, key in (("exact (the default)", EXACT_ROW), ("fused", FUSED_ROW)):
        if sdpa and key in fused:
            ratio = fused[key]["median_ms"] / sdpa
            rows.append(
                (
                    f"captured call, capture.attention: {label}, output + every frame statistic, x SDPA",
                    f"{ratio:.2f}x",
                    "<= 1.25x",
                    ratio <= 1.25,
                )
            )
    gen = results.get("generation", {})
    for label, target in (
        ("1 layer (layer 4)", 2.0),
        ("all 30 layers", 20.0),
        ("1 layer (layer 4), fused", 2.0),
        ("all 30 layers, fused", 20.0),
    ):
        row = gen.get(f"eager, {label}", {})
        if "overhead_pct" in row:
            rows.append(
                (
                    f"21-frame generation, {label} captured (eager, the default at 21 frames), rows collected",
                    f"{row['overhead_pct']:+.1f}%",
                    f"<= +{target:.0f}%",
                    row["overhead_pct"] <= target,
                )
            )
        base = gen.get("eager, no capture", {}).get("generation_seconds_median")
        if base and "generation_seconds_median" in row:
            alone = 100 * (row["generation_seconds_median"] / base - 1)
            rows.append(
                (
                    f"21-frame generation, {label} captured, the generation alone (what a job waits for)",
                    f"{alone:+.1f}%",
                    f"<= +{target:.0f}%",
                    alone <= target,
                )
            )
    jobs = results.get("jobs", {})
    one, thirty = jobs.get("eager, 1 layer per job", {}), jobs.get("eager, 30 layers per job", {})
    if "timings" in one and "timings" in thirty:
        bound = 2 * (one["timings"]["load_seconds"] + one["timings"]["generation_seconds"])
        rows.append(
            (
                "30-layer job, fresh process, wall s (bound: 2 x the 1-layer job's load + generation)",
                f"{thirty['wall_seconds']:.1f}",
                f"<= {bound:.1f}",
                thirty["wall_seconds"] <= bound,
            )
        )
        rows.append(
            (
                "results/extract of one 21-frame video, 30 layers, MB",
                f"{thirty['output_mib'] * MiB / 1e6:.0f}",
                "<= 200",
                thirty["output_mib"] * MiB / 1e6 <= 200,
            )
        )
    rollouts = results.get("rollouts", {})
    for policy, row in rollouts.items():
        if isinstance(row, dict) and "video_fps" in row and policy != "memory":
            rows.append(
                (
                    f"{rollouts['frames']} frames, {policy}, 1 layer, {rollouts['default_mode']} (the default), "
                    "video FPS",
                    f"{row['video_fps']:.1f}",
                    ">= 30",
                    row["video_fps"] >= 30,
                )
            )
    memory = rollouts.get("memory", {})
    peaks = [row["peak_gib"] for row in memory.values() if isinstance(row, dict) and row.get("peak_gib")]
    if len(peaks) >= 2:
        growth = 100 * (peaks[-1] / peaks[0] - 1)
        rows.append((f"peak memory, deep_sink, {' to '.join(memory)} frames", f"{growth:+.2f}%", "<= +1%", growth <= 1))
    if not rows:
        return []
    lines = ["| issue 18 target | measured | target | |", "|---|---|---|---|"]
    lines += [f"| {name} | {value} | {target} | {'met' if met else 'missed'} |" for name, value, target, met in rows]
    return lines + [""]


# -- first generation in a fresh process ---------------------------------------------------


class CallClock:
    """Synchronizes and timestamps every model call (probe only: it serializes the GPU)."""

    def __init__(self):
        self.marks = []

    def begin_call(self, info):
        torch.cuda.synchronize()
        self.marks.append((time.perf_counter(), f"block {info.block} {info.pass_} {info.step}"))


def probe_warmup(backend: str, layers: list[int]) -> dict:
    """Run in a fresh process: two generations, the first one call by call."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    began = time.perf_counter()
    model = random_real_model()
    context = random_context()
    torch.cuda.synchronize()
    setup = time.perf_counter() - began
    chosen = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    result = {"setup_seconds": setup}
    for run in range(2):
        clock = CallClock()
        with sdpa_kernel(chosen) if chosen else nullcontext():
            with FrameStatsCapture(model, layers, frame_seq_length=1560) as capture:
                observers = [capture, clock] if run == 0 else [capture]
                out = generate(model, context, options=GenerationOptions(), seed=0, observers=observers)
        result[f"generation_{run + 1}_seconds"] = out.seconds
        if run == 0:
            torch.cuda.synchronize()
            marks = clock.marks + [(time.perf_counter(), "end")]
            calls = [(marks[i + 1][0] - marks[i][0], marks[i][1]) for i in range(len(marks) - 1)]
            result["slowest_first_calls_ms"] = [
                (label, round(1e3 * t, 1)) for t, label in sorted(calls, reverse=True)[:6]
            ]
            result["median_first_call_ms"] = round(1e3 * sorted(t for t, _ in calls)[len(calls) // 2], 1)
    return result


def section_warmup() -> dict:
    results = {}
    for backend in ("default", "flash"):
        for layers in ([], [4]):
            label = f"{backend} SDPA, {'1 layer captured' if layers else 'no capture'}"
            proc = subprocess.run(
                [sys.executable, __file__, "--probe-warmup", backend, ",".join(map(str, layers))],
                capture_output=True,
                text=True,
                timeout=300,
            )
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            results[label] = json.loads(line[7:]) if line else {"error": proc.stderr[-2000:]}
    return results


# -- report ------------------------------------------------------------------------------------


def markdown(results: dict) -> str:
    lines = []
    env = results.get("env", {})
    if env:
        lines += [
            f"Device: {env.get('device')} ({env.get('sm_count')} SMs); torch {env.get('torch')}, triton "
            f"{env.get('triton')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}; bf16 matmul "
            f"{env.get('bf16_matmul_tflops', 0):.0f} TFLOP/s, copy {env.get('copy_tb_s', 0):.2f} TB/s; nvidia-smi: "
            f"{env.get('nvidia_smi', '-')}",
            "",
        ]
    lines += targets_table(results)
    stats = results.get("stats", {})
    if "timings" in stats:
        lines += [
            "| statistics call (last block, 12 x 4680 x 32760, bf16) | median ms | min | max | extra GPU MiB "
            "| x SDPA |",
            "|---|---|---|---|---|---|",
        ]
        for name, row in stats["timings"].items():
            lines.append(
                f"| {name} | {row['median_ms']:.3f} | {row['min_ms']:.3f} | {row['max_ms']:.3f} | "
                f"{row['extra_mib']:.1f} | {row['x_sdpa']:.2f} |"
            )
        lines += [
            "",
            "Accuracy (max abs error): " + ", ".join(f"{k} {v:.2e}" for k, v in stats["accuracy"].items()),
            "",
        ]
        lines += [
            "Triton sweep (ms): "
            + ", ".join(f"{k}: {v if isinstance(v, str) else f'{v:.3f}'}" for k, v in stats["triton_sweep_ms"].items()),
            "",
        ]
    fused = results.get("fused", {})
    if "timings" in fused:
        lines += [
            "| captured call (last block, 12 x 4680 x 32760, bf16) | median ms | min | max | extra GPU MiB | x SDPA |",
            "|---|---|---|---|---|---|",
        ]
        for name, row in fused["timings"].items():
            lines.append(
                f"| {name} | {row['median_ms']:.3f} | {row['min_ms']:.3f} | {row['max_ms']:.3f} | "
                f"{row['extra_mib']:.1f} | {row['x_sdpa']:.2f} |"
            )
        lines += ["", "Accuracy: " + ", ".join(f"{k} {v:.2e}" for k, v in fused["accuracy"].items()), ""]
        for kernel in ("3", "4"):
            sweep = fused.get(f"kernel_{kernel}_sweep_ms", {})
            lines += [
                f"Kernel {kernel} sweep (ms): "
                + ", ".join(f"{k}: {v if isinstance(v, str) else f'{v:.3f}'}" for k, v in sweep.items()),
                "",
            ]
    gen = results.get("generation", {})
    if gen:
        lines += [
            "| generation, 21 latent frames (81 video frames) | s (median) | min-max | video FPS | overhead | peak "
            "GiB | extra peak MiB | of which generation s | collecting the rows s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for key, row in gen.items():
            if not isinstance(row, dict):
                continue
            if "error" in row:
                lines.append(f"| {key} | error: {row['error'][:80]} | | | | | | | |")
                continue
            lines.append(
                f"| {key} | {row['seconds_median']:.3f} | {row['seconds_min']:.3f}-{row['seconds_max']:.3f} | "
                f"{row['video_fps']:.1f} | {row.get('overhead_pct', 0):+.1f}% | {row['peak_gib']:.2f} | "
                f"{row.get('extra_peak_mib', 0):.0f} | {row.get('generation_seconds_median', float('nan')):.3f} | "
                f"{row.get('collect_seconds_median', float('nan')):.3f} |"
            )
        lines.append("")
    handoff = results.get("handoff", {})
    if handoff and "error" not in handoff:
        lines += [
            "| 30 layers captured, warm, eager: the records | generation s (median) | after it s |",
            "|---|---|---|",
        ]
        for key, row in handoff.items():
            if isinstance(row, dict) and "generation_seconds_median" in row:
                lines.append(f"| {key} | {row['generation_seconds_median']:.2f} | {row['after_seconds_median']:.2f} |")
        lines.append("")
    jobs = results.get("jobs", {})
    if jobs:
        lines += [
            "| extraction job, fresh process | wall s | import s | start-up s | load s | generation s | collect s | "
            "write s | output MiB |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for key, row in jobs.items():
            if not isinstance(row, dict):
                continue
            if "error" in row:
                lines.append(f"| {key} | error | | | | | | | |")
                continue
            t = row["timings"]
            lines.append(
                f"| {key} | {row['wall_seconds']:.1f} | {row['import_seconds']:.1f} | "
                f"{t.get('startup_seconds', 0):.1f} | {t['load_seconds']:.1f} | {t['generation_seconds']:.2f} | "
                f"{t.get('collect_seconds', 0):.2f} | {t.get('write_seconds', 0):.2f} | {row['output_mib']:.1f} |"
            )
        lines.append(f"\n(writing the random fp32 release folder took {jobs.get('write_release_seconds', 0):.1f} s)")
    return "\n".join(lines)


def main() -> int:
    global KERNELS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    parser.add_argument("--sections", default="env,fused,generation,job,rollouts")
    parser.add_argument("--reps", type=int, default=3, help="timed generations per variant (after one warm-up)")
    parser.add_argument("--modes", default="eager,compile", help="generation variants: eager, compile")
    parser.add_argument("--frames", type=int, default=240, help="the rollouts section's length in latent frames")
    parser.add_argument("--no-key-split", action="store_true", help="one SDPA call per cached attention (no key split)")
    parser.add_argument(
        "--no-fused-norms", action="store_true", help="the block's norms, gates and RoPE as eager PyTorch ops"
    )
    parser.add_argument("--no-cuda-graphs", action="store_true", help="no CUDA graphs of the layers' work")
    parser.add_argument("--probe-warmup", nargs=2, metavar=("BACKEND", "LAYERS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    KERNELS = KernelSettings(
        key_split=not args.no_key_split, fused_norms=not args.no_fused_norms, cuda_graphs=not args.no_cuda_graphs
    )
    if args.probe_warmup:
        backend, layers = args.probe_warmup
        print("RESULT " + json.dumps(probe_warmup(backend, [int(x) for x in layers.split(",") if x])))
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sections = args.sections.split(",")
    modes = args.modes.split(",")
    results: dict = {}
    runners = {
        "env": section_env,
        "stats": section_stats,
        "fused": section_fused,
        "tma": section_tma,
        "generation": lambda: section_generation(args.reps, modes),
        "job": lambda: section_jobs(Path(tempfile.mkdtemp(prefix="sinkscope-bench-")), modes),
        "warmup": section_warmup,
        "handoff": lambda: section_handoff(args.reps),
        "rollouts": lambda: section_rollouts(args.frames),
    }
    for name in sections:
        began = time.perf_counter()
        try:
            results["jobs" if name == "job" else name] = runners[name]()
        except Exception as error:  # noqa: BLE001 - keep the other sections
            results[name] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-3000:]}
        print(f"[{name}] {time.perf_counter() - began:.1f} s", flush=True)
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    table = markdown(results)
    if "warmup" in results:
        table += "\n\nFirst generation in a fresh process:\n" + json.dumps(results["warmup"], indent=1)
    (out / "results.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
