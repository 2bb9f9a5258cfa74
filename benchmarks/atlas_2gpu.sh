#!/usr/bin/env bash
# A head atlas spread over the two GPUs of one machine: `snakemake --resources gpu=2` on
# configs/head-atlas-1.3b.yaml made small enough for one device call (one seed, the heads of
# the first LAYERS layers, the sink_per_head sweep only, jobs of RUNS runs), on a seeded-random
# model of the 1.3B's shape (format: demo, no weight files). Snakemake counts GPUs but assigns
# none; each extraction job takes a free one (sinkscope.pipeline.resources.acquire_gpu).
# Prints the wall time to the head_atlas table, then per extraction job its GPU, start, end
# and runs (from the job logs and benchmark files), so the overlap can be read.
#   bash benchmarks/atlas_2gpu.sh WORKDIR [LAYERS] [RUNS]
set -euo pipefail
work=${1:?usage: atlas_2gpu.sh WORKDIR [LAYERS] [RUNS]}
layers=${2:-8}
runs=${3:-24}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
python3 - "$root/configs/head-atlas-1.3b.yaml" "$work/config.yaml" "$layers" "$runs" <<'EOF'
import sys

import yaml

source, target, layers, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
config = yaml.safe_load(open(source))
config["results"] = "results"
config["checkpoints"] = {"self_forcing": {"model": "wan2.1-t2v-1.3b", "format": "demo"}}
config["seeds"] = [0]
config["runs_per_job"] = runs
config["device"] = "cuda"  # any free GPU: each job takes one
heads = [f"L{layer + 1}H{head + 1}" for layer in range(layers) for head in range(12)]
config["sweeps"] = {"sink_per_head": {**config["sweeps"]["sink_per_head"], "over": heads}}
yaml.safe_dump(config, open(target, "w"), sort_keys=False)
EOF
nvidia-smi --query-gpu=index,name --format=csv,noheader
began=$(date +%s.%N)
python3 -m snakemake results/tables/checkpoints/self_forcing/head_atlas.parquet \
    -s "$root/Snakefile" -d "$work" --cores 16 --resources gpu=2 > "$work/snakemake.out" 2>&1 \
    || { tail -40 "$work/snakemake.out"; exit 1; }
python3 -c "import sys, time; print(f'wall to head_atlas: {time.time() - float(sys.argv[1]):.1f} s')" "$began"
sed -n '/^Job stats:/,/^total/p' "$work/snakemake.out" | head -20
for log in $(find "$work/results/logs/extract_attention" "$work/results/logs/extract_runs" -name "*.log" | sort); do
    echo "== ${log#"$work"/}"
    head -1 "$log" | cut -c1-23 | sed 's/^/first line /'
    grep -E "loaded in| runs: " "$log" | cut -c1-200
    grep -oE "^[0-9-]+ [0-9:,]+ INFO extracting .* on cuda:[0-9]+" "$log" | sed -E 's/layers \[[^]]*\]/layers [...]/' | head -2
    tail -1 "$log" | cut -c1-23 | sed 's/^/last line /'
done
for tsv in $(find "$work/results/benchmarks/extract_attention" "$work/results/benchmarks/extract_runs" -name "*.tsv" | sort); do
    echo "== ${tsv#"$work"/}: $(tail -1 "$tsv" | cut -f1-2)"
done
