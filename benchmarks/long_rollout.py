"""GPU benchmark of long rollouts and token profiles at the Wan2.1-T2V-1.3B size (random bf16 weights).

Sections (``--sections``, comma-separated):

- ``tokens``: the cost of key-token profiles: one statistics call at the last block's
  shape with and without them, against the SDPA call; and one 21-frame generation with
  one layer captured, token profiles none / last_block / all.
- ``policies``: a ``--frames`` (default 240 = 60 s of video) rollout under every KV-cache
  policy with one layer captured (token profiles of the last block, the default): video
  FPS (4 video frames a latent frame), peak GPU memory, KV cache bytes.
- ``memory``: peak memory of one bounded policy at 21, 120 and 480 latent frames.
- ``profile``: torch.profiler over one rollout of ``--profile-frames`` under ``--policy``
  (eager, then compiled): GPU kernel time against wall time, and the top kernels, so
  the docs can say whether a long rollout is bound by the GPU or by the host.
- ``gaps``: why the GPU idles in a rollout of ``--profile-frames`` under ``--policy``
  (eager): the operations that synchronize with the host, and the profiled idle gaps
  between kernels with their causes.

Timing follows docs/performance.md: CUDA-synchronized wall time of the whole generation
after a warm-up generation in the same process (so library and kernel set-up are out).

    PYTHONPATH=src python benchmarks/long_rollout.py --out $OUT --sections tokens,policies,memory
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from sinkscope.attention.settings import KernelSettings  # noqa: E402
from sinkscope.generation.capture import FrameStatsCapture  # noqa: E402
from sinkscope.generation.sampler import generate  # noqa: E402
from sinkscope.model import WanModel, build_model, get_model_config, init_random_weights  # noqa: E402
from sinkscope.options import CACHE_POLICIES, GenerationOptions, procedures_running  # noqa: E402
from sinkscope.stats.attention import attention_statistics  # noqa: E402

GiB = 2**30
LAYER = 4


DEVICE = "cuda"
# The kernels every model of this run computes with (--no-key-split turns the split off).
KERNELS = KernelSettings()
# The policies issue 18 asks to run at >= 30 video FPS at 240 frames in the default mode.
TARGET_POLICIES = ("window", "sink", "deep_sink", "participative_compression", "rerope_sink")


def real_model(name: str = "wan2.1-t2v-1.3b"):
    if DEVICE == "cpu":  # a smoke test of this script
        model = build_model(name, seed=0)
    else:
        config = get_model_config(name)
        with torch.device("meta"):
            model = WanModel(config)
        model = model.to_empty(device=DEVICE)
        init_random_weights(model, seed=0, device=DEVICE)
        model = model.to(torch.bfloat16).eval().requires_grad_(False)
    model.kernels = KERNELS
    return model


def sync():
    if DEVICE != "cpu":
        torch.cuda.synchronize()


def context(model):
    return torch.randn(1, 24, model.config.text_dim, generator=torch.Generator().manual_seed(1)).to(DEVICE)


def video_frames(latent_frames: int) -> int:
    return 4 * latent_frames - 3  # Wan's causal VAE: 21 latent frames = 81 video frames


def run(model, options, layers, token_profiles="last_block"):
    fsl = model.config.frame_seq_length()
    sync()
    if DEVICE != "cpu":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    capture = FrameStatsCapture(model, layers, frame_seq_length=fsl, token_profiles=token_profiles)
    with capture:
        result = generate(model, context(model), options=options, seed=0, observers=[capture])
    rows = sum(len(t["frames"]) for t in capture.layer_tables().values()) if layers else 0
    sync()
    seconds = time.perf_counter() - began
    return {
        "seconds": seconds,
        "generation_seconds": result.seconds,
        "video_fps": video_frames(options.num_frames) / seconds,
        "peak_gib": torch.cuda.max_memory_allocated() / GiB if DEVICE != "cpu" else None,
        "kv_cache_gib": result.kv_cache_bytes / GiB,
        "rows": rows,
        "latents_finite": bool(torch.isfinite(result.latents.float()).all()),
    }


def section_tokens(model) -> dict:
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    out = {}
    if DEVICE == "cpu":
        return {"skipped": "cpu smoke test"}
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(12, 4680, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(12, 32760, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kwargs = dict(frame_seq_length=1560, query_frames=range(18, 21), key_frames=range(21))

    from gpu_benchmark import cuda_time

    def timed(fn):
        return cuda_time(fn, reps=30)["median_ms"]

    out["sdpa_ms"] = timed(lambda: sdpa(q[None], k[None], v[None]))
    out["stats_ms"] = timed(lambda: attention_statistics(q, k, **kwargs))
    out["stats_with_tokens_ms"] = timed(lambda: attention_statistics(q, k, token_profiles=True, **kwargs))
    out["tokens_extra_ms"] = out["stats_with_tokens_ms"] - out["stats_ms"]
    out["tokens_extra_x_sdpa"] = out["tokens_extra_ms"] / out["sdpa_ms"]
    options = GenerationOptions()
    run(model, options, [LAYER], "none")  # warm-up
    for mode in ("none", "last_block", "all", "none", "last_block", "all"):
        result = run(model, options, [LAYER], mode)
        out.setdefault(f"generation_{mode}", []).append(result["seconds"])
    base = min(out["generation_none"])
    for mode in ("last_block", "all"):
        out[f"overhead_{mode}_pct"] = 100 * (min(out[f"generation_{mode}"]) / base - 1)
    return out


def policy_options(policy: str, frames: int) -> GenerationOptions:
    """A rollout of ``frames`` under ``policy``, in the procedure the policy runs in
    (rolling_forcing: Rolling Forcing's window)."""
    return GenerationOptions.from_config(
        {"num_frames": frames, "cache_policy": policy, "procedure": procedures_running(policy)[0]}
    )


def section_policies(model, frames: int, policies=CACHE_POLICIES) -> dict:
    out = {}
    run(model, GenerationOptions(num_frames=21), [LAYER])  # warm-up
    for policy in policies:
        if policy == "global" and frames > 120:
            continue  # the global cache grows with the video (30 layers x frames x 1560 tokens)
        options = policy_options(policy, frames)
        try:
            out[policy] = {**run(model, options, [LAYER]), "options": options.to_dict()}
        except Exception as error:  # noqa: BLE001 - report, keep going
            out[policy] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-1500:]}
        print(policy, json.dumps({k: v for k, v in out[policy].items() if k != "options"}), flush=True)
    return out


def section_job_overhead(model) -> dict:
    """What the default token profiles add to a one-layer extraction job's own work:
    the generation with capture, building the rows and writing the layer's files."""
    import tempfile

    import pandas as pd

    from sinkscope.tables import (
        FRAME_ATTENTION_SCHEMA,
        QUERY_STATS_SCHEMA,
        TOKEN_PROFILES_SCHEMA,
        write_table,
    )

    schemas = {"frames": FRAME_ATTENTION_SCHEMA, "queries": QUERY_STATS_SCHEMA, "tokens": TOKEN_PROFILES_SCHEMA}
    fsl = model.config.frame_seq_length()
    out: dict = {}
    run(model, GenerationOptions(), [LAYER], "none")  # warm-up
    for mode in ("none", "last_block") * 3:
        sync()
        began = time.perf_counter()
        capture = FrameStatsCapture(model, [LAYER], frame_seq_length=fsl, token_profiles=mode)
        with capture:
            generate(model, context(model), options=GenerationOptions(), seed=0, observers=[capture])
        parts = capture.layer_tables()[LAYER]
        with tempfile.TemporaryDirectory() as tmp:
            for kind, rows in parts.items():
                if rows is None:
                    continue
                runs = {
                    n: pd.Categorical.from_codes([0] * len(rows), [v])
                    for n, v in (("checkpoint", "x"), ("variant", "default"), ("prompt_id", "p"))
                }
                write_table(
                    rows.assign(**runs, seed=0), f"{tmp}/{kind}.parquet", schemas[kind], {}, row_groups_by="block"
                )
        out.setdefault(mode, []).append(time.perf_counter() - began)
    out["extra_seconds"] = min(out["last_block"]) - min(out["none"])
    # A one-layer extraction job took 14.4 s end to end (docs/performance.md (c)).
    out["extra_pct_of_a_14.4s_job"] = 100 * out["extra_seconds"] / 14.4
    return out


def section_compiled(model, frames: int, policies=TARGET_POLICIES, mode: str | None = None) -> dict:
    """The same rollouts with the tensor work around attention compiled: what a job runs
    by default on CUDA for long rollouts (``capture.compile: auto``)."""
    model.compile_blocks(dynamic=False, **({"mode": mode} if mode else {}))
    out = {"mode": mode or "default"}
    began = time.perf_counter()
    run(model, GenerationOptions(num_frames=21), [LAYER])  # compiles
    out["compile_warmup_seconds"] = time.perf_counter() - began
    for policy in policies:
        options = policy_options(policy, frames)
        out[policy] = run(model, options, [LAYER])
        print(policy, "compiled", json.dumps(out[policy]), flush=True)
    return out


def section_memory(model, policy: str = "deep_sink", lengths=(21, 120, 480)) -> dict:
    out = {}
    for frames in lengths:
        options = GenerationOptions.from_config({"num_frames": frames, "cache_policy": policy})
        out[str(frames)] = run(model, options, [LAYER])
        print(policy, frames, json.dumps(out[str(frames)]), flush=True)
    return out


def _profiled(model, options) -> dict:
    run(model, options, [LAYER])  # warm-up (and compilation) outside the profile
    wall = run(model, options, [LAYER])["seconds"]
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        run(model, options, [LAYER])
    events = prof.key_averages()
    kernel_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    launches = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return {
        "wall_seconds": wall,
        "gpu_kernel_seconds": kernel_us / 1e6,
        "gpu_busy_share": kernel_us / 1e6 / wall,
        "kernel_launches": launches,
        "top_kernels": events.table(sort_by="self_device_time_total", row_limit=14),
    }


# CUDA runtime calls that make the host wait for the GPU (or for the driver).
BLOCKING_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cudaMemcpyAsync",
    "cudaHostAlloc",
    "cudaFreeHost",
    "cudaMalloc",
    "cudaFree",
    "cudaHostRegister",
)


def idle_gaps(prof, threshold_us: float = 50.0) -> dict:
    """Where the GPU sat idle during a profiled run: every gap of more than ``threshold_us``
    between kernels, each put down to the blocking CUDA runtime call that ends in it (the
    host waited for the GPU, then had to refill its queue) or, if none, to the host's own
    work (the CPU ops running at the gap's start)."""
    events = prof.events()
    kernels = sorted(
        (e for e in events if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda e: e.time_range.start
    )
    cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    blocking = sorted((e for e in cpu if e.name in BLOCKING_CALLS), key=lambda e: e.time_range.end)
    ops = sorted(
        (e for e in cpu if e.name.startswith("aten::") or e.name.startswith("sinkscope")),
        key=lambda e: e.time_range.start,
    )
    gaps, busy_until = [], kernels[0].time_range.end if kernels else 0
    for kernel in kernels[1:]:
        if kernel.time_range.start - busy_until > threshold_us:
            gaps.append((busy_until, kernel.time_range.start))
        busy_until = max(busy_until, kernel.time_range.end)
    causes: dict = defaultdict(lambda: {"gaps": 0, "idle_ms": 0.0})
    ends = [e.time_range.end for e in blocking]
    starts = [e.time_range.start for e in ops]
    longest = max((e.time_range.end - e.time_range.start for e in ops), default=0.0)
    for start, end in gaps:
        first = bisect.bisect_left(ends, start - 20.0)
        waits = [e for e in blocking[first:] if e.time_range.end <= end and e.time_range.start < end]
        if waits:
            cause = "waited in " + waits[0].name
        else:
            cause = "host busy in " + (" > ".join(_innermost_ops(ops, starts, longest, start)) or "Python")
        causes[cause]["gaps"] += 1
        causes[cause]["idle_ms"] += (end - start) / 1e3
    kernel_ms = sum(e.time_range.end - e.time_range.start for e in kernels) / 1e3
    span_ms = (kernels[-1].time_range.end - kernels[0].time_range.start) / 1e3 if kernels else 0.0
    top = sorted(causes.items(), key=lambda item: -item[1]["idle_ms"])[:15]
    return {
        "threshold_us": threshold_us,
        "kernel_ms": kernel_ms,
        "first_to_last_kernel_ms": span_ms,
        "idle_ms_in_gaps": sum(end - start for start, end in gaps) / 1e3,
        "gaps": len(gaps),
        "blocking_calls": {name: sum(1 for e in blocking if e.name == name) for name in BLOCKING_CALLS},
        "causes": dict(top),
    }


def _innermost_ops(ops: list, starts: list[float], longest: float, moment: float, count: int = 3) -> list[str]:
    """The names of the last ``count`` ops (``ops`` sorted by start, ``starts`` their starts,
    ``longest`` the longest op's duration) that began by ``moment`` and were still running
    then, outermost first."""
    found = []
    for index in range(bisect.bisect_right(starts, moment) - 1, -1, -1):
        if starts[index] < moment - longest:  # no earlier op lasts until moment
            break
        if ops[index].time_range.end >= moment:
            found.append(ops[index].name)
            if len(found) == count:
                break
    return found[::-1]


def section_gaps(model, frames: int, policy: str) -> dict:
    """Why the GPU idles in a long rollout: the operations that synchronize with the host
    (``torch.cuda.set_sync_debug_mode``: the Python line of each), and the profiled idle
    gaps with their causes (``idle_gaps``). Eager."""
    import warnings

    options = policy_options(policy, frames)
    run(model, options, [LAYER])  # warm-up
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if DEVICE != "cpu":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            run(model, options, [LAYER])
        finally:
            if DEVICE != "cpu":
                torch.cuda.set_sync_debug_mode("default")
    syncs: dict = {}
    for warning in caught:
        where = f"{Path(warning.filename).name}:{warning.lineno}: {str(warning.message).splitlines()[0][:80]}"
        syncs[where] = syncs.get(where, 0) + 1
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if DEVICE != "cpu" else []
    )
    with torch.profiler.profile(activities=activities) as prof:
        run(model, options, [LAYER])
    return {"policy": policy, "frames": frames, "synchronizing_ops": syncs, "gaps": idle_gaps(prof)}


def section_profile(model, frames: int, policy: str) -> dict:
    """Is a long rollout bound by the GPU or by the host? Eager, then compiled."""
    options = policy_options(policy, frames)
    out = {"policy": policy, "frames": frames, "eager": _profiled(model, options)}
    model.compile_blocks(dynamic=False)
    out["compiled"] = _profiled(model, options)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    parser.add_argument("--sections", default="tokens,policies,memory")
    parser.add_argument("--frames", type=int, default=240)
    parser.add_argument("--model", default="wan2.1-t2v-1.3b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--policy", default="window", help="the profile section's cache policy")
    parser.add_argument(
        "--policies",
        default=None,
        help="cache policies of the policies and compiled sections "
        "(default: every policy / the five of the 30 FPS target)",
    )
    parser.add_argument("--compile-mode", default=None, help="torch.compile mode of the compiled section")
    parser.add_argument("--no-key-split", action="store_true", help="one SDPA call per cached attention (no key split)")
    parser.add_argument("--profile-frames", type=int, default=45, help="the profile section's rollout length")
    args = parser.parse_args()
    global DEVICE, KERNELS
    if args.no_key_split:
        KERNELS = KernelSettings(key_split=False)
    DEVICE = args.device
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {"device": torch.cuda.get_device_name() if DEVICE != "cpu" else "cpu", "torch": torch.__version__}
    model = real_model(args.model)
    for section in args.sections.split(","):
        began = time.perf_counter()
        try:
            if section == "tokens":
                results[section] = section_tokens(model)
            elif section == "policies":
                results[section] = section_policies(
                    model, args.frames, args.policies.split(",") if args.policies else CACHE_POLICIES
                )
            elif section == "job":
                results[section] = section_job_overhead(model)
            elif section == "compiled":
                results[section] = section_compiled(
                    model,
                    args.frames,
                    args.policies.split(",") if args.policies else TARGET_POLICIES,
                    args.compile_mode,
                )
            elif section == "profile":
                results[section] = section_profile(model, args.profile_frames, args.policy)
            elif section == "gaps":
                results[section] = section_gaps(model, args.profile_frames, args.policy)
            elif section == "memory":
                results[section] = section_memory(model, lengths=(21, 120, 480) if DEVICE != "cpu" else (21, 30))
        except Exception as error:  # noqa: BLE001
            results[section] = {
                "error": f"{type(error).__name__}: {error}",
                "traceback": traceback.format_exc()[-3000:],
            }
        results[f"{section}_wall_seconds"] = time.perf_counter() - began
        (out_dir / "long_rollout.json").write_text(json.dumps(results, indent=1))
        print(section, json.dumps(results[section], indent=1)[:3000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
