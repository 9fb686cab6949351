#!/usr/bin/env bash
# The scale benchmark of the certified head (benchmarks/scale.py) on a GPU host: the same columns as the committed
# benchmarks/results/scale.csv, rank r on cuda:r, NCCL all-reduces, rows in float64 (and float32 with ROW_DTYPE).
# Not run here (no GPU).
#
#   benchmarks/scale_gpu.sh [GPUS] [SIZE ...]
#
# GPUS   the largest number of GPUs (default 2): runs 1 and GPUS processes
# SIZE   numbers of rows (default 50000 200000 1281167, the last ImageNet's training set)
# Environment: PYTHON (default .venv/bin/python, else python), ROW_DTYPE (float64 or float32, default float64),
#              OUT (default benchmarks/results/scale_gpu.csv), P (default 512), K (default 100).
# Run from the repository root.
set -euo pipefail

if [[ $# -ge 1 && ( "$1" == "-h" || "$1" == "--help" ) ]]; then
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
gpus=${1:-2}
shift || true
sizes=("$@")
[[ ${#sizes[@]} -eq 0 ]] && sizes=(50000 200000 1281167)
python=${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python)}
ranks=(1)
[[ "$gpus" -gt 1 ]] && ranks+=("$gpus")
PYTHONPATH=".:bench${PYTHONPATH:+:$PYTHONPATH}" "$python" benchmarks/scale.py --device cuda --backend nccl \
    --threads 4 --sizes "${sizes[@]}" --ranks "${ranks[@]}" --p "${P:-512}" --K "${K:-100}" \
    --row-dtype "${ROW_DTYPE:-float64}" --out "${OUT:-benchmarks/results/scale_gpu.csv}"
