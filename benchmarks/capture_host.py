"""Where a captured call spends its host time, by Python function (cProfile).

At the 1.3B's last block (random bf16, as ``frame_route.py``), each of: the model's call
(``cached_attention``), the ``exact`` route's statistics with ``capture.statistics:
[logit_mean]`` (``attention_statistics``), and the ``frames`` route's statistics
(``statistics_from_frames``), ``--calls`` times queued after a warm-up, under cProfile; the
GPU is synchronized only outside the profiled loop. Writes each profile's top functions by
own time to ``--out``/host-profile.txt and prints them.

    PYTHONPATH=src python benchmarks/capture_host.py --out $OUT
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from sinkscope.attention.split import cached_attention  # noqa: E402
from sinkscope.stats.attention import attention_statistics  # noqa: E402
from sinkscope.stats.segments import frame_attention, statistics_from_frames  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    heads, fsl, num_q, num_k = 12, 1560, 3, 21
    g = torch.Generator(device="cuda").manual_seed(0)
    q4, k4, v4 = (
        torch.randn(1, frames * fsl, heads, 128, device="cuda", generator=g).bfloat16()
        for frames in (num_q, num_k, num_k)
    )
    q, k, v = (x[0].transpose(0, 1) for x in (q4, k4, v4))
    lengths = (fsl,) * num_k
    layout = dict(frame_seq_length=fsl, query_frames=list(range(18, 21)), key_frames=list(range(21)))
    _, frame_lse, lse = frame_attention(q, k, v, lengths)
    cases = {
        "model call": lambda: cached_attention(q4, k4, v4),
        "exact statistics, logit_mean": lambda: attention_statistics(q, k, statistics=["logit_mean"], **layout),
        "frames statistics": lambda: statistics_from_frames(
            q, k, frame_lse, lse, fsl, num_q, lengths, 128**-0.5, statistics=["logit_mean", "prob_mass"]
        ),
    }
    report = []
    for name, fn in cases.items():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        profile = cProfile.Profile()
        began = time.perf_counter()
        profile.enable()
        for _ in range(args.calls):
            fn()
        profile.disable()
        host_ms = (time.perf_counter() - began) * 1000 / args.calls
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(18)
        report.append(f"== {name}: {host_ms:.3f} ms of host time a call (profiled)\n{text.getvalue()}")
        print(report[-1], flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "host-profile.txt").write_text("\n".join(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
