#!/usr/bin/env bash
# One study with both newer bases on a 2-GPU machine (benchmarks/two_bases_2gpu.yaml: LongLive
# 2.0 on Wan2.2-TI2V-5B and Krea Realtime 14B, real shapes, seeded random weights):
# `snakemake --cores 16 --resources gpu=2` runs the two extraction jobs at once, each on a
# free GPU (sinkscope.pipeline.resources.acquire_gpu). Prints, per job, the GPU it ran on,
# its start and end, from the job logs.
#   bash benchmarks/two_bases_2gpu.sh WORKDIR
set -euo pipefail
work=${1:?usage: two_bases_2gpu.sh WORKDIR}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
cp "$root/benchmarks/two_bases_2gpu.yaml" "$work/config.yaml"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
began=$(date +%s)
python -m snakemake results/extract/longlive2_5b/a/seed0/layers0_4_9_14_19_24_29 \
    results/extract/krea_14b/a/seed0/layers0_4_9_14_19_24_29 \
    -s "$root/Snakefile" -d "$work" --cores 16 --resources gpu=2 > "$work/snakemake.out" 2>&1 || { tail -40 "$work/snakemake.out"; exit 1; }
echo "wall: $(( $(date +%s) - began )) s"
for log in "$work"/results/logs/extract_attention/*/a/seed0/*.log; do
    echo "== $log"
    grep -E "extracting|generation [0-9]|peak" "$log" | sed -E 's/\{.*\}\)/...)/' | cut -c1-400
done
