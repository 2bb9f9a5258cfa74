"""One captured call by route, at the 1.3B's last block and LongLive 2.0's last chunk.

Shapes (random bf16, the capture's [H, L, D] views of the model's [1, L, H, D] tensors):
``wan1.3b`` 12 heads x 4680 queries (3 frames of 1560) over 21 key frames; ``longlive2``
24 heads x 7040 queries (8 frames of 880) over 40 key frames. Per shape, each timed two
ways (``captured_call.py``'s: ``alone``, events around one call; ``queued``, 20 calls back
to back, per call) and as a ratio to the model's own uncaptured call (``cached_attention``,
the keys split as ``capture.kernels: fast`` splits them):

- ``exact`` (all four statistics: the model's call, then the pass given its log-sum-exp),
  ``exact_logit_mean`` (``capture.statistics: [logit_mean]``: the model's call and the
  frames' sums), ``fused`` (the TMA pass and its combine), ``frames`` (``capture.attention:
  frames``, logit_mean and prob_mass);
- the parts of ``frames``: its cuDNN call over the frames (the queries shared through a zero
  batch stride), the merge, the statistics;
- a probe for a ``frames`` route with argmax_share: cuDNN's graph API
  (``nvidia-cudnn-frontend``, where importable) over the frames, the queries shared, each
  row's max score and sum of exp(s - max) out of the call (cuDNN gives those two or the
  log-sum-exp, not the three).

Each timing also gives ``host_ms``: the host's time a call to queue the 20; where it is
near ``queued_ms``, the host, not the GPU, sets the pace.

Accuracy at the real shape: the frames route's statistics against the exact route's, its
output against the model's call. Writes ``results.json`` to ``--out`` after every entry.

    PYTHONPATH=src python benchmarks/frame_route.py --out $OUT
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from report import error_entry, write_results  # noqa: E402
from sinkscope.attention.split import attention_with_lse, cached_attention, merge_parts  # noqa: E402
from sinkscope.stats.attention import attention_with_statistics  # noqa: E402
from sinkscope.stats.segments import frame_attention, statistics_from_frames  # noqa: E402

SHAPES = {
    "wan1.3b": dict(heads=12, fsl=1560, num_q=3, num_k=21),
    "longlive2": dict(heads=24, fsl=880, num_q=8, num_k=40),
}
FRAMES_STATISTICS = ["logit_mean", "prob_mass"]


def alone_ms(fn, reps: int = 15, warmup: int = 3) -> float:
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
    return statistics.median(times)


def queued_ms(fn, calls: int = 20, warmup: int = 3) -> tuple[float, float]:
    """(GPU ms a call with ``calls`` queued back to back, host ms a call to queue them): where the
    two agree, the host, not the GPU, sets the pace."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began = time.perf_counter()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    host = (time.perf_counter() - began) * 1000 / calls
    end.synchronize()
    return start.elapsed_time(end) / calls, host


def cudnn_frontend_frames(q4, k4, v4, num_k: int):
    """A callable running every key frame as a batch entry of one graph of cuDNN's graph API, the
    queries shared by a zero batch stride, each row's max score and sum of exp(s - max) out of it
    (cuDNN gives those two or the log-sum-exp, not all three), and its outputs (out [F, Lq, H, D],
    max [F, H, Lq, 1], sum_exp [F, H, Lq, 1])."""
    import cudnn

    _, num_q, heads, dim = q4.shape
    n = k4.shape[1] // num_k
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    graph = cudnn.pygraph(
        io_data_type=cudnn.data_type.BFLOAT16,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
    )
    bf16, fp32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT
    kv_stride = [n * heads * dim, dim, heads * dim, 1]
    q_t = graph.tensor(name="q", dim=[num_k, heads, num_q, dim], stride=[0, dim, heads * dim, 1], data_type=bf16)
    k_t = graph.tensor(name="k", dim=[num_k, heads, n, dim], stride=kv_stride, data_type=bf16)
    v_t = graph.tensor(name="v", dim=[num_k, heads, n, dim], stride=kv_stride, data_type=bf16)
    row_stride = [heads * num_q, num_q, 1, 1]
    max_t = graph.tensor(name="max", dim=[num_k, heads, num_q, 1], stride=row_stride, data_type=fp32)
    sum_t = graph.tensor(name="sum_exp", dim=[num_k, heads, num_q, 1], stride=row_stride, data_type=fp32)
    o_t, _ = graph.sdpa(
        name="sdpa",
        q=q_t,
        k=k_t,
        v=v_t,
        generate_stats=False,
        attn_scale=dim**-0.5,
        use_causal_mask=False,
        score_max=max_t,
        score_sum_exp=sum_t,
    )
    o_t.set_output(True).set_dim([num_k, heads, num_q, dim]).set_stride([num_q * heads * dim, dim, heads * dim, 1])
    max_t.set_output(True)
    sum_t.set_output(True)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    workspace = torch.empty(max(1, graph.get_workspace_size()), device="cuda", dtype=torch.uint8)
    out = torch.empty(num_k, num_q, heads, dim, device="cuda", dtype=torch.bfloat16)
    row_max = torch.empty(num_k, heads, num_q, 1, device="cuda", dtype=torch.float32)
    sum_exp = torch.empty_like(row_max)
    pack = {q_t: q4, k_t: k4, v_t: v4, o_t: out, max_t: row_max, sum_t: sum_exp}

    def run():
        graph.execute(pack, workspace, handle=handle)

    return run, (out, row_max, sum_exp)


def recorder(name: str, shape: dict, results: dict, out: str):
    """``(entry, record)``: the shape's entry, put in ``results[name]``, and ``record(key, fn)``,
    which times ``fn`` both ways into ``entry[key]`` (or its error), prints it and writes the
    results so far."""
    entry: dict = {"shape": shape}
    results[name] = entry

    def record(key, fn):
        try:
            gpu, host = queued_ms(fn)
            entry[key] = {"alone_ms": round(alone_ms(fn), 4), "queued_ms": round(gpu, 4), "host_ms": round(host, 4)}
        except Exception as error:  # noqa: BLE001 - report, keep going
            entry[key] = error_entry(error)
        print(name, key, entry[key] if "error" not in entry[key] else entry[key]["error"], flush=True)
        write_results(results, out, partial=True)

    return entry, record


def measure_shapes(measure, names: str, shapes: dict, results: dict, out: str) -> None:
    """``measure(name, shape, results, out)`` for each of the comma-separated ``names``: a shape
    that fails is recorded as ``<name>_failed`` (and printed) and the next one runs."""
    for name in names.split(","):
        try:
            measure(name, shapes[name], results, out)
        except Exception as error:  # noqa: BLE001 - report, keep going
            results[f"{name}_failed"] = error_entry(error)
            print(name, "failed", results[f"{name}_failed"]["traceback"], flush=True)
        torch.cuda.empty_cache()


def add_ratios(entry: dict) -> None:
    """Each timed row of ``entry`` as a ratio to its ``model_call`` row."""
    base = entry["model_call"]
    for row in list(entry.values()):
        if isinstance(row, dict) and "queued_ms" in row and "queued_ms" in base:
            row["queued_x_model_call"] = round(row["queued_ms"] / base["queued_ms"], 4)
            row["alone_x_model_call"] = round(row["alone_ms"] / base["alone_ms"], 4)
            row["host_x_model_call_gpu"] = round(row["host_ms"] / base["queued_ms"], 4)


def shape_inputs(shape: dict) -> tuple:
    """Random bf16 q, k, v of a shape ([1, L, H, 128]), their [H, L, D] views as the capture
    passes them, the key frames' lengths and the layout arguments of ``attention_with_statistics``."""
    heads, fsl, num_q, num_k = shape["heads"], shape["fsl"], shape["num_q"], shape["num_k"]
    g = torch.Generator(device="cuda").manual_seed(0)
    q4, k4, v4 = (
        torch.randn(1, frames * fsl, heads, 128, device="cuda", generator=g).bfloat16()
        for frames in (num_q, num_k, num_k)
    )
    views = tuple(x[0].transpose(0, 1) for x in (q4, k4, v4))
    layout = dict(frame_seq_length=fsl, query_frames=list(range(num_k - num_q, num_k)), key_frames=list(range(num_k)))
    return (q4, k4, v4), views, (fsl,) * num_k, layout


def measure_shape(name: str, shape: dict, results: dict, out: str) -> None:
    heads, fsl, num_q, num_k = shape["heads"], shape["fsl"], shape["num_q"], shape["num_k"]
    (q4, k4, v4), (q, k, v), lengths, layout = shape_inputs(shape)
    scale = 128**-0.5
    entry, record = recorder(name, shape, results, out)
    record("model_call", lambda: cached_attention(q4, k4, v4))
    record("exact", lambda: attention_with_statistics(q, k, v, **layout))
    record("exact_logit_mean", lambda: attention_with_statistics(q, k, v, statistics=["logit_mean"], **layout))
    # `fused` as a job runs it: FlashAttention-4's one pass where it applies, else the Triton kernel.
    record("fused", lambda: attention_with_statistics(q, k, v, fused=True, **layout))
    record("frames", lambda: attention_with_statistics(q, k, v, frames=True, statistics=FRAMES_STATISTICS, **layout))
    shared = q[None].expand(num_k, heads, num_q * fsl, 128)
    keys, values = (x.unflatten(1, (num_k, fsl)).transpose(0, 1) for x in (k, v))
    record("frames_cudnn_call", lambda: attention_with_lse(shared, keys, values, scale))
    part_out, part_lse = attention_with_lse(shared, keys, values, scale)
    record("frames_merge", lambda: merge_parts(part_out, part_lse, 1, num_k))
    merged, frame_lse, lse = frame_attention(q, k, v, lengths)
    record(
        "frames_statistics",
        lambda: statistics_from_frames(q, k, frame_lse, lse, fsl, num_q, lengths, scale, statistics=FRAMES_STATISTICS),
    )
    try:
        run, (fe_out, fe_max, fe_sum) = cudnn_frontend_frames(q4, k4, v4, num_k)
        run()
        torch.cuda.synchronize()
        scores = torch.einsum("hqd,fhkd->fhqk", q[:, :256].float(), keys.float()) * scale
        entry["cudnn_fe_max_sum_exp_agrees"] = {
            "out_max_diff": (fe_out.transpose(1, 2).float() - part_out.float()).abs().max().item(),
            "lse_max_diff": (fe_max[..., 0] + torch.log(fe_sum[..., 0]) - part_lse).abs().max().item(),
            "max_max_diff_first_256_queries": (fe_max[:, :, :256, 0] - scores.amax(-1)).abs().max().item(),
        }
        record("cudnn_fe_max_sum_exp", run)
    except Exception as error:  # noqa: BLE001
        entry["cudnn_fe_max_sum_exp"] = error_entry(error)
        print(name, "cudnn_fe_max_sum_exp", entry["cudnn_fe_max_sum_exp"]["error"], flush=True)
    # Accuracy of the frames route at the real shape, against the exact route.
    out_frames, stats_frames = attention_with_statistics(q, k, v, frames=True, statistics=FRAMES_STATISTICS, **layout)
    out_exact, stats_exact = attention_with_statistics(q, k, v, **layout)
    entry["accuracy"] = {
        "prob_mass_max_diff_vs_exact": (stats_frames.prob_mass - stats_exact.prob_mass).abs().max().item(),
        "logit_mean_max_diff_vs_exact": (stats_frames.logit_mean - stats_exact.logit_mean).abs().max().item(),
        "output_max_diff_vs_model_call": (out_frames.float() - out_exact.float()).abs().max().item(),
        "output_max_abs": out_exact.float().abs().max().item(),
        "prob_mass_sum_max_error": (stats_frames.prob_mass.sum(-1) - 1).abs().max().item(),
    }
    add_ratios(entry)
    write_results(results, out, partial=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    parser.add_argument("--shapes", default=",".join(SHAPES))
    args = parser.parse_args()
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    try:
        import cudnn

        results["cudnn_frontend"] = cudnn.__version__
        results["cudnn_backend"] = cudnn.backend_version()
    except Exception as error:  # noqa: BLE001
        results["cudnn_frontend"] = error_entry(error)
    results["cudnn_torch"] = torch.backends.cudnn.version()
    measure_shapes(measure_shape, args.shapes, SHAPES, results, args.out)
    summary = {
        name: {key: row.get("queued_x_model_call") for key, row in entry.items() if isinstance(row, dict)}
        for name, entry in results.items()
        if name in SHAPES
    }
    results["summary_queued_x_model_call"] = summary
    return write_results(results, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
