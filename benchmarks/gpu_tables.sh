#!/usr/bin/env bash
# The GPU reproduction tables (issue 21.4) in the committed format of benchmarks/results/<config>/:
# each config's full scale on the paper's datasets under ROOT, one `lightning-unlearn reproduce` per config
# through benchmarks/tables.py (README.md with the exact command, UTC date, GPUs, wall and CPU time, and the
# tables `ours (paper)`; summary.md, recipe.yaml, paper_vs_ours.csv/.png per setup). Resumable: run it again
# after a stop and only the missing rows run.
#
#   benchmarks/gpu_tables.sh ROOT [DEVICES] [CONFIG ...]
#
# ROOT     the datasets in torchvision's layout (ROOT/cifar-10-batches-py/, cifar-100-python/, tiny-imagenet-200/,
#          FashionMNIST/raw/, MNIST/raw/, lfw-py/, celeba/; see bench/lightning_unlearn_bench/datasets.py)
# DEVICES  GPUs per run (default 1)
# CONFIG   configs to run (default: the GPU ones, acu-table1 rbm-table2 hf-table6 safe-table1; their GPU time
#          estimates are README.md's table under "reproduce": ~2 h per ACU dataset, ~3.3 h per RBM block,
#          ~1-23 h per HF Table 6 setup, ~45 min to ~10 h per SAFE dataset)
# Environment: PYTHON (default .venv/bin/python, else python), RESULTS (default benchmarks/results/gpu),
#              DRY_RUN=1 prints the commands only.
# Run from the repository root. ViT-Tiny is a model of `compare --model vit_tiny`; no seed paper's table uses it:
# a config copied with `model: vit_tiny` runs here by its path as CONFIG.
set -euo pipefail

if [[ $# -lt 1 || "$1" == "-h" || "$1" == "--help" ]]; then
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    [[ $# -ge 1 ]] && exit 0 || exit 2
fi
root=$1
devices=${2:-1}
if [[ ! -d "$root" ]]; then
    echo "gpu_tables.sh: ROOT '$root' is not a directory" >&2
    exit 2
fi
if ! [[ "$devices" =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu_tables.sh: DEVICES must be a positive integer, got '$devices'" >&2
    exit 2
fi
shift $(( $# >= 2 ? 2 : 1 ))
configs=("$@")
[[ ${#configs[@]} -gt 0 ]] || configs=(acu-table1 rbm-table2 hf-table6 safe-table1)
python=${PYTHON:-}
if [[ -z "$python" ]]; then
    if [[ -x .venv/bin/python ]]; then python=.venv/bin/python; else python=python; fi
fi
dry=()
[[ "${DRY_RUN:-0}" == "1" ]] && dry=(--dry-run)

status=0
for config in "${configs[@]}"; do
    "$python" benchmarks/tables.py "$config" --results "${RESULTS:-benchmarks/results/gpu}" "${dry[@]}" -- \
        --root "$root" --trainer.accelerator gpu --trainer.devices "$devices" || status=$?
done
exit "$status"
