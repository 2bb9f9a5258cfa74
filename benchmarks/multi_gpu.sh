#!/usr/bin/env bash
# Two extraction jobs at once on a 2-GPU machine: `snakemake --cores 16 --resources gpu=2`.
# Snakemake counts GPUs but assigns none; each job takes a free one (sinkscope.pipeline.resources.acquire_gpu).
# Prints, per job, the GPU it ran on and its start and end, from the job logs.
#   bash benchmarks/multi_gpu.sh WORKDIR
set -euo pipefail
work=${1:?usage: multi_gpu.sh WORKDIR}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
cp "$root/benchmarks/multi_gpu_config.yaml" "$work/config.yaml"
nvidia-smi --query-gpu=index,name --format=csv,noheader
began=$(date +%s)
python -m snakemake results/extract/demo/a/seed0/layers0-5 results/extract/demo/b/seed0/layers0-5 \
    -s "$root/Snakefile" -d "$work" --cores 16 --resources gpu=2 > "$work/snakemake.out" 2>&1
echo "wall: $(( $(date +%s) - began )) s"
for log in "$work"/results/logs/extract_attention/demo/*/seed0/layers0-5.log; do
    echo "== $log"
    grep -E "extracting|generation [0-9]" "$log" | sed -E 's/\{.*\}\)/...)/'
done
