"""Peak memory and time of importing a real-size token-level legacy cache.

Writes one layer of a token-level cache as run_extraction_figure4.py wrote it
([1, 12, 4680, 32760] bf16 logits = 3.7 GB: the last Self-Forcing block's 3 query
frames against all 21 key frames at 1560 tokens a frame), then imports it in fresh
subprocesses and reports each one's peak resident memory (getrusage ru_maxrss, which
counts the mapped file pages it touched) and wall time:

- ``baseline``: the interpreter with torch and sinkscope.legacy imported, nothing else;
- ``peek_layers``: what Snakemake does at DAG-build time;
- ``import (pages released)``: ``import_to_parquet`` as shipped;
- ``import (mmap only)``: the same with the page release switched off, for comparison.

    python benchmarks/import_memory.py            # real size, temp dir removed after
    python benchmarks/import_memory.py --queries 468 --keys 3276 --fsl 156   # quick

Not a test: it needs ~4 GB of disk and a minute or two.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

WRITE = """
import sys, time, torch
path, heads, lq, lk, fsl = sys.argv[1], *map(int, sys.argv[2:6])
began = time.perf_counter()
logits = torch.empty(1, heads, lq, lk, dtype=torch.bfloat16)
g = torch.Generator().manual_seed(0)
frames = torch.arange(lk) // fsl
for h in range(heads):
    # Logit-like values: noise plus a per-key-frame offset (a sink on frame 0).
    offset = torch.randn(lk // fsl, generator=g)[frames] + 3.0 * (frames == 0)
    logits[0, h] = (torch.randn(lq, lk, generator=g) * 2 + offset).to(torch.bfloat16)
nq = lq // fsl
nk = lk // fsl
torch.save({"attention_weights": [{"layer_idx": 0, "attn_logits": logits, "is_logits": True, "frame_seq_length": fsl,
            "num_heads": heads, "num_query_frames": nq, "num_key_frames": nk}],
            "prompt": "A majestic eagle soaring through a cloudy sky, cinematic lighting", "num_frames": nk,
            "frame_seq_length": fsl, "query_frames": list(range(nk - nq, nk)), "key_frames": list(range(nk))}, path)
print(time.perf_counter() - began)
"""

MEASURE = """
import json, resource, sys, time
import torch
import sinkscope.legacy as legacy
mode, path, out = sys.argv[1:4]
legacy._RELEASE_PAGES = mode != "mmap_only"
began = time.perf_counter()
result = None
if mode == "peek":
    result = legacy.peek_layers(path)
elif mode != "baseline":
    legacy.import_to_parquet(path, out, checkpoint="bench")
seconds = time.perf_counter() - began
print(json.dumps({"seconds": seconds, "maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "result": result, "threads": torch.get_num_threads()}))
"""


def run(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"subprocess failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        ram = f"{mem / 2**20:.1f} GiB RAM"
    except (OSError, StopIteration):
        ram = "unknown RAM"
    return (
        f"{os.cpu_count()} cores ({cpu}), {ram}, {platform.system()} {platform.release()}, Python "
        f"{platform.python_version()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--queries", type=int, default=4680, help="query tokens (3 frames x 1560)")
    parser.add_argument("--keys", type=int, default=32760, help="key tokens (21 frames x 1560)")
    parser.add_argument("--fsl", type=int, default=1560, help="frame_seq_length")
    parser.add_argument("--dir", help="where to write the cache (default: a temporary folder, removed after)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    import torch

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "attention_cache_figure4.pt"
        out = Path(tmp) / "frame_attention.parquet"
        write_seconds = float(run(WRITE, str(path), str(args.heads), str(args.queries), str(args.keys), str(args.fsl)))
        size = path.stat().st_size
        print(f"machine: {machine()}; torch {torch.__version__}")
        print(
            f"cache: [1, {args.heads}, {args.queries}, {args.keys}] bf16, {size / 2**30:.2f} GiB ({size:,} bytes), "
            f"written in {write_seconds:.1f} s"
        )
        results = {
            "machine": machine(),
            "torch": torch.__version__,
            "file_bytes": size,
            "shape": [1, args.heads, args.queries, args.keys],
            "frame_seq_length": args.fsl,
        }
        for mode, label in (
            ("baseline", "baseline (imports only)"),
            ("peek", "peek_layers"),
            ("release", "import (pages released)"),
            ("mmap_only", "import (mmap only)"),
        ):
            out.unlink(missing_ok=True)
            measured = json.loads(run(MEASURE, mode, str(path), str(out)))
            results[mode] = measured
            rss = measured["maxrss_bytes"]
            print(
                f"{label:26s} peak RSS {rss / 2**30:6.2f} GiB ({rss / size:5.2f} x file)   time "
                f"{measured['seconds']:7.2f} s"
                + (f"   -> {measured['result']}" if measured["result"] is not None else "")
            )
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
