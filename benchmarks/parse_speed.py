"""How long `snakemake -n` takes on a real-size study, next to Snakemake's own floor.

The study: a checkpoint of the Wan2.1-T2V-1.3B config (30 layers), 3 prompts, 2 seeds,
every layer captured, one layer per job (180 extraction jobs and everything downstream,
the largest DAG the pipeline builds for it). The floor: `snakemake -n` on a one-rule
Snakefile, i.e. Snakemake's import and start-up on this machine. Each command is run
``--repeat`` times in a fresh process; the medians are printed.

    python benchmarks/parse_speed.py [--repeat 5] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
STUDY = {
    "checkpoints": {"big": {"model": "wan2.1-t2v-1.3b", "format": "demo"}},
    "prompts": {"a": "a cat on a sofa", "b": "a dog in the park", "c": "a bird over the sea"},
    "seeds": [0, 1],
    "layers": list(range(30)),
    "layers_per_job": 1,
    "device": "cpu",
}


def timed(command: list[str], cwd: Path, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
        times.append(time.perf_counter() - began)
        if result.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    snakemake = [sys.executable, "-m", "snakemake", "--cores", "1", "--resources", "gpu=1", "-n", "-q"]
    with tempfile.TemporaryDirectory() as tmp:
        floor_dir = Path(tmp) / "floor"
        floor_dir.mkdir()
        (floor_dir / "Snakefile").write_text('rule all:\n    output: "x"\n    shell: "touch {output}"\n')
        study_dir = Path(tmp) / "study"
        study_dir.mkdir()
        (study_dir / "config.yaml").write_text(yaml.safe_dump(STUDY))
        floor = timed(snakemake, floor_dir, args.repeat)
        command = snakemake + ["--snakefile", str(ROOT / "Snakefile"), "--directory", str(study_dir)]
        first = timed(command, study_dir, 1)  # fills the digest caches (.snakemake/sinkscope)
        study = timed(command, study_dir, args.repeat)
        jobs = subprocess.run([c for c in command if c != "-q"], cwd=study_dir, capture_output=True, text=True).stdout
    total = next((line.split()[-1] for line in jobs.splitlines() if line.startswith("total")), "?")
    result = {
        "floor_median_s": statistics.median(floor),
        "study_first_s": first[0],
        "study_median_s": statistics.median(study),
        "sinkscope_overhead_s": statistics.median(study) - statistics.median(floor),
        "jobs": total,
        "repeat": args.repeat,
        "python": sys.version.split()[0],
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(f"snakemake -n, one-rule Snakefile (the floor): {result['floor_median_s']:.2f} s")
    print(
        f"snakemake -n, 30 layers x 3 prompts x 2 seeds ({total} jobs): first {first[0]:.2f} s, "
        f"then {result['study_median_s']:.2f} s (median of {args.repeat})"
    )
    print(f"sinkscope's share: {result['sinkscope_overhead_s']:.2f} s")


if __name__ == "__main__":
    main()
