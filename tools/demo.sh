#!/usr/bin/env bash
# The embedded default end to end: set-up, then 2 local workers train a tiny OPT with DeepSpeed.
# Extra arguments are Hydra overrides: tools/demo.sh train.max_steps=400
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
# This machine, CPU ranks, even where Slurm answers or GPUs exist (cluster=slurm / gpus_per_node=N
# on the command line still choose them): SLURMTRAIN_AUTO=off turns auto-detection off.
export SLURMTRAIN_AUTO="${SLURMTRAIN_AUTO-off}"
exec .venv/bin/python -m slurmtrain "$@"
