"""FlashAttention-4 with every key frame's partials (``sinkscope.stats.flash4_partials``) against
the model's own call and the other capture routes, at the 1.3B's last block and LongLive 2.0's
last chunk (random bf16, the shapes of ``frame_route.py``).

Per shape:

- ``same_output_as_model_call``: the one pass's output and the model's call's
  (``cached_attention``, FlashAttention-4 under the key split), compared bit for bit;
- the statistics (every frame statistic, from the partials) against the statistics after the
  model's call given its log-sum-exp (the ``exact`` route where the one pass does not apply):
  the largest difference of each;
- ms a call (``frame_route.py``'s ``queued``: 20 back to back; and ``alone``) of: the model's
  call; the one pass with its combine (``flash4_partials_route``); its kernel and merges alone
  (``partials_only``); both without the key split (``partials_unsplit``) against
  FlashAttention-4's plain call (``flash4_unsplit``), and the kernel keeping only the sums of p
  and p (t - g) or nothing (``keeps``); the ``exact`` route as a job runs it (the one pass where
  it applies), and with every statistic but entropy (``exact_no_entropy``); the Triton one-pass
  kernel (``fused_triton``, ``attention_statistics_tma``); each as a ratio to the model's call;
  ``_inexact``: the kernel whose output comes from its own sums of p (``exact_output=False``),
  with its output's and statistics' differences;
- with ``--profile``, ``kernels``: the GPU kernels of the model's call and of the ``exact``
  route (with and without entropy) under torch.profiler, ms a call by kernel name, so that
  what the route adds to the call can be told apart (the kernel, the merges, the combine).

Needs a Hopper GPU and ``flash-attn-4``. Writes ``results.json`` to ``--out``.

    PYTHONPATH=src python benchmarks/flash4_partials.py [--profile] --out $OUT
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from capture_profile import kernel_totals, profiled  # noqa: E402
from frame_route import SHAPES, add_ratios, measure_shapes, recorder, shape_inputs  # noqa: E402

from report import write_results  # noqa: E402
from sinkscope.attention.flash4 import flash4_attention_with_lse  # noqa: E402
from sinkscope.attention.split import cached_attention  # noqa: E402
from sinkscope.stats.attention import attention_statistics, attention_with_statistics  # noqa: E402
from sinkscope.stats.flash4_partials import flash4_attention_partials, statistics_from_partials  # noqa: E402
from sinkscope.stats.launch import attention_statistics_tma  # noqa: E402


def route(q, k, v, lengths, fsl, num_q, scale, exact_output=True, entropy=True):
    out, partials = flash4_attention_partials(q, k, v, lengths, scale, exact_output=exact_output, entropy=entropy)
    return out, statistics_from_partials(q, k, partials, fsl, num_q, lengths, scale)


def kernels_per_call(fn, calls: int = 20) -> dict[str, dict]:
    """GPU kernels of ``calls`` back-to-back calls of ``fn`` (after a warm-up), by name: launches
    and ms a call, the largest first."""
    fn()
    torch.cuda.synchronize()

    def run():
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()

    totals = kernel_totals(profiled(run))
    rows = sorted(totals.items(), key=lambda item: -item[1][1])
    return {name[:120]: {"launches": n // calls, "ms": round(ms / calls, 4)} for name, (n, ms) in rows}


def profile_shape(entry: dict, q4, k4, v4, q, k, v, layout: dict) -> None:
    no_entropy = ("logit_mean", "prob_mass", "argmax_share")
    entry["kernels"] = {
        "model_call": kernels_per_call(lambda: cached_attention(q4, k4, v4)),
        "exact": kernels_per_call(lambda: attention_with_statistics(q, k, v, **layout)),
        "exact_no_entropy": kernels_per_call(
            lambda: attention_with_statistics(q, k, v, statistics=no_entropy, **layout)
        ),
    }


def measure_shape(name: str, shape: dict, results: dict, out: str, profile: bool = False) -> None:
    fsl, num_q = shape["fsl"], shape["num_q"]
    (q4, k4, v4), (q, k, v), lengths, layout = shape_inputs(shape)
    scale = 128**-0.5
    entry, record = recorder(name, shape, results, out)
    began = time.perf_counter()
    out_route, stats_route = route(q, k, v, lengths, fsl, num_q, scale)
    torch.cuda.synchronize()
    entry["first_call_seconds"] = round(time.perf_counter() - began, 3)
    out_model, model_lse = cached_attention(q4, k4, v4)
    # The reference: the statistics after the model's call, given its log-sum-exp (the exact
    # route's way where the one pass does not apply).
    stats_exact = attention_statistics(q, k, lse=model_lse[0], key_lengths=lengths, **layout)
    entry["same_output_as_model_call"] = bool(torch.equal(out_route, out_model[0]))
    entry["output_max_diff_vs_model_call"] = (out_route.float() - out_model[0].float()).abs().max().item()
    entry["statistics_max_diff_vs_exact"] = {
        name_: (getattr(stats_route, name_) - getattr(stats_exact, name_)).abs().max().item()
        for name_ in ("logit_mean", "prob_mass", "argmax_share", "entropy")
    }
    entry["prob_mass_sum_max_error"] = (stats_route.prob_mass.sum(-1) - 1).abs().max().item()
    out_inexact, stats_inexact = route(q, k, v, lengths, fsl, num_q, scale, exact_output=False)
    entry["inexact_output_max_diff_vs_model_call"] = (out_inexact.float() - out_model[0].float()).abs().max().item()
    entry["inexact_statistics_max_diff_vs_exact"] = {
        name_: (getattr(stats_inexact, name_) - getattr(stats_exact, name_)).abs().max().item()
        for name_ in ("logit_mean", "prob_mass", "argmax_share", "entropy")
    }
    unsplit, _ = flash4_attention_partials(q, k, v, lengths, scale, split=False)
    plain, _ = flash4_attention_with_lse(*(x.transpose(1, 2) for x in (q4, k4, v4)), scale)
    entry["unsplit_same_output_as_flash4"] = bool(torch.equal(unsplit, plain[0].transpose(0, 1)))
    write_results(results, out, partial=True)

    if profile:
        profile_shape(entry, q4, k4, v4, q, k, v, layout)
        write_results(results, out, partial=True)
    record("model_call", lambda: cached_attention(q4, k4, v4))
    record("flash4_partials_route", lambda: route(q, k, v, lengths, fsl, num_q, scale))
    record("partials_only", lambda: flash4_attention_partials(q, k, v, lengths, scale))
    record("flash4_partials_route_inexact", lambda: route(q, k, v, lengths, fsl, num_q, scale, exact_output=False))
    record(
        "partials_unsplit_inexact",
        lambda: flash4_attention_partials(q, k, v, lengths, scale, split=False, exact_output=False),
    )
    record("flash4_unsplit", lambda: flash4_attention_with_lse(*(x.transpose(1, 2) for x in (q4, k4, v4)), scale))
    record("partials_unsplit", lambda: flash4_attention_partials(q, k, v, lengths, scale, split=False))
    for keeps in ("sums", "nothing"):  # the kernel keeping less: what each part of its work costs
        record(
            f"partials_unsplit_keeps_{keeps}",
            lambda keeps=keeps: flash4_attention_partials(q, k, v, lengths, scale, split=False, keeps=keeps),
        )
    record("exact", lambda: attention_with_statistics(q, k, v, **layout))
    no_entropy = ("logit_mean", "prob_mass", "argmax_share")  # the kernel keeps no sum of p t
    record("exact_no_entropy", lambda: attention_with_statistics(q, k, v, statistics=no_entropy, **layout))
    # The Triton one-pass kernel itself (`fused` now takes FlashAttention-4's pass where it applies).
    record("fused_triton", lambda: attention_statistics_tma(q, k, v, fsl, num_q, lengths, scale))
    add_ratios(entry)
    write_results(results, out, partial=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--profile", action="store_true", help="also the kernels of each route (torch.profiler)")
    args = parser.parse_args()
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    measure = functools.partial(measure_shape, profile=args.profile)
    measure_shapes(measure, args.shapes, SHAPES, results, args.out)
    return write_results(results, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
