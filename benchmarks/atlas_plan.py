"""How long `snakemake -n` takes to plan a 3-seed head atlas at the 1.3B's shape (about
1,200 runs), and how the plan spreads over two GPUs.

The study is configs/head-atlas-1.3b.yaml with its checkpoint made a seeded-random model of
the Wan2.1-T2V-1.3B config (``format: demo``: the same 30 layers x 12 heads, so the same
360-head sweep, 18 frames and 25 pruning runs a seed; no weight files) on the CPU, its
30 layers one job as ``layers_per_job: auto`` gives on a GPU. Each
`snakemake -n` runs in a fresh process: the first fills the digest caches
(.snakemake/sinkscope), then ``--repeat`` more, whose median is printed, beside Snakemake's
own floor (a one-rule Snakefile). With ``--resources gpu=2`` the extraction jobs that wait
for nothing (a job a seed and chunk of runs) are ready at once: the plan lists how many
jobs are ready before any finishes (each asks for one GPU, so two run at once).

    python benchmarks/atlas_plan.py [--repeat 3] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def study() -> dict:
    config = yaml.safe_load((ROOT / "configs" / "head-atlas-1.3b.yaml").read_text())
    config["checkpoints"] = {"self_forcing": {"model": "wan2.1-t2v-1.3b", "format": "demo"}}
    config["device"] = "cpu"
    config["layers_per_job"] = 30  # what auto gives on a GPU: the plan the 1.3B's atlas runs
    config.pop("results", None)
    return config


def timed(command: list[str], cwd: Path, repeat: int) -> tuple[list[float], str]:
    times, out = [], ""
    for _ in range(repeat):
        began = time.perf_counter()
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
        times.append(time.perf_counter() - began)
        if result.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
        out = result.stdout + result.stderr
    return times, out


def job_stats(text: str) -> dict[str, int]:
    counts = {}
    for line in text.split("Job stats:", 1)[-1].splitlines():
        match = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if match:
            counts[match.group(1)] = int(match.group(2))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    snakemake = [sys.executable, "-m", "snakemake", "--cores", "4", "-n"]
    with tempfile.TemporaryDirectory() as tmp:
        floor_dir = Path(tmp) / "floor"
        floor_dir.mkdir()
        (floor_dir / "Snakefile").write_text('rule all:\n    output: "x"\n    shell: "touch {output}"\n')
        study_dir = Path(tmp) / "study"
        study_dir.mkdir()
        (study_dir / "config.yaml").write_text(yaml.safe_dump(study()))
        floor, _ = timed([*snakemake, "--resources", "gpu=1"], floor_dir, args.repeat)
        command = [*snakemake, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(study_dir)]
        first, _ = timed([*command, "--resources", "gpu=1"], study_dir, 1)
        times, out = timed([*command, "--resources", "gpu=1"], study_dir, args.repeat)
        _, two = timed([*command, "--resources", "gpu=2"], study_dir, 1)
    from sinkscope.pipeline.study import load_study

    plan = load_study(study(), check_this_machine=False)
    runs = sum(len(plan.variants_of(c)) for c in plan.checkpoints) * len(plan.prompts) * len(plan.seeds)
    counts = job_stats(out)
    extraction = {rule: count for rule, count in counts.items() if rule.startswith("extract_")}
    # Ready at the start: the jobs of several runs that wait for nothing, every seed's.
    ready = sum(len(plan.seeds) * len(plan.prompts) for job in plan.extraction_jobs if not job.inputs)
    result = {
        "runs": runs,
        "jobs": counts.get("total"),
        "extraction_jobs": extraction,
        "floor_median_s": statistics.median(floor),
        "first_s": first[0],
        "median_s": statistics.median(times),
        "repeat": args.repeat,
        "gpu2_plan_jobs": job_stats(two).get("total"),
        "ready_at_start": ready,
        "python": sys.version.split()[0],
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(f"snakemake -n, one-rule Snakefile (the floor): {result['floor_median_s']:.2f} s")
    print(
        f"snakemake -n, the 1.3B's head atlas, 3 seeds ({runs} runs, {result['jobs']} jobs; extraction "
        f"{extraction}): first {first[0]:.2f} s, then {result['median_s']:.2f} s (median of {args.repeat})"
    )
    print(f"with --resources gpu=2: the same {result['gpu2_plan_jobs']} jobs; {ready} extraction jobs ready at once")


if __name__ == "__main__":
    main()
