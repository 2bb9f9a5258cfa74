"""Launch configurations of the Triton kernels that turn the one pass's partials into the
statistics, at the 1.3B's last block and LongLive 2.0's last chunk (the shapes of
``frame_route.py``), ms a call (20 queued):

- ``segment_sums``: ``segment_part_sums`` over every key frame of k (logit_mean's key sums),
  per configuration (rows a step ``BLOCK_L``, programs aimed at ``PROGRAMS``, ``num_warps``),
  with the bandwidth that is;
- ``combine``: ``reductions.combine_frame_partials`` (``frame_statistics_combine_kernel`` and its finish)
  on the partials of ``flash4_attention_partials`` (FlashAttention-4 on a Hopper GPU), per
  configuration (query rows a program ``BLOCK_M``, at most ``TILE`` rows x frames, ``num_warps``),
  with each statistic's largest difference from the default configuration's.

    PYTHONPATH=src python benchmarks/combine_configs.py --out $OUT
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from frame_route import SHAPES, queued_ms, shape_inputs  # noqa: E402

from report import write_results  # noqa: E402
from sinkscope.stats.launch_support import _segments_on  # noqa: E402
from sinkscope.stats.reductions import (  # noqa: E402
    DEFAULT_COMBINE_CONFIG,
    DEFAULT_SEGMENT_CONFIG,
    combine_frame_partials,
    segment_part_sums,
)

SEGMENT_CONFIGS = [
    dict(BLOCK_L=block_l, PROGRAMS=programs, num_warps=warps)
    for block_l, programs, warps in itertools.product((32, 64, 128), (512, 1024, 2048), (4, 8))
]
COMBINE_CONFIGS = [
    dict(BLOCK_M=block_m, TILE=tile, num_warps=warps)
    for block_m, tile, warps in itertools.product((16, 32, 64, 128), (2048, 4096), (2, 4, 8))
]
STATISTICS = ("logit_mean", "prob_mass", "argmax_share", "entropy")


def segment_rows(k, lengths) -> list[dict]:
    reference = segment_part_sums(k, lengths).sum(0)
    gigabytes = k.numel() * k.element_size() / 1e9
    rows = []
    for config in SEGMENT_CONFIGS:
        sums = segment_part_sums(k, lengths, config=config).sum(0)
        ms, _ = queued_ms(lambda config=config: segment_part_sums(k, lengths, config=config))
        rows.append(
            {
                **config,
                "ms": round(ms, 4),
                "tb_per_s": round(gigabytes / ms, 3),
                "max_diff": (sums - reference).abs().max().item(),
            }
        )
        print(rows[-1], flush=True)
    return sorted(rows, key=lambda row: row["ms"])


def combine_rows(q, k, v, lengths, fsl, num_q) -> list[dict]:
    from sinkscope.stats.flash4_partials import flash4_attention_partials

    scale = 128**-0.5
    _, partials = flash4_attention_partials(q, k, v, lengths, scale)
    key_sums = segment_part_sums(k, lengths)
    lengths_float = _segments_on(q.device, lengths)[2]

    def combine(config):
        return combine_frame_partials(q, partials, key_sums, lengths_float, fsl, num_q, scale, config)[0]

    reference = combine(None)
    rows = []
    for config in COMBINE_CONFIGS:
        stats = combine(config)
        ms, _ = queued_ms(lambda config=config: combine(config))
        diffs = {name: (getattr(stats, name) - getattr(reference, name)).abs().max().item() for name in STATISTICS}
        rows.append({**config, "ms": round(ms, 4), "max_diff": diffs})
        print(rows[-1], flush=True)
    return sorted(rows, key=lambda row: row["ms"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    args = parser.parse_args()
    results: dict = {
        "device": torch.cuda.get_device_name(),
        "defaults": {"segment_sums": DEFAULT_SEGMENT_CONFIG, "combine": DEFAULT_COMBINE_CONFIG},
    }
    for name, shape in SHAPES.items():
        _, (q, k, v), lengths, _ = shape_inputs(shape)
        results[name] = {
            "segment_sums": segment_rows(k, lengths),
            "combine": combine_rows(q, k, v, lengths, shape["fsl"], shape["num_q"]),
        }
        write_results(results, args.out, partial=True)
    return write_results(results, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
