#!/usr/bin/env bash
# The demo end to end: set-up, then 2 local workers train a small OPT (model=opt_demo and its
# recipe) on Python's own source for about a minute and a half, and it prints a sample of what the
# model learned. Extra arguments are Hydra overrides and win: tools/demo.sh train.max_steps=800
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
# This machine, CPU ranks, even where Slurm answers or GPUs exist (cluster=slurm / gpus_per_node=N
# on the command line still choose them): SLURMTRAIN_AUTO=off turns auto-detection off.
export SLURMTRAIN_AUTO="${SLURMTRAIN_AUTO-off}"
# A finished local run prints the model's continuation of this prompt before its next commands.
export SLURMTRAIN_SAMPLE_PROMPT="${SLURMTRAIN_SAMPLE_PROMPT-def }"
exec .venv/bin/python -m slurmtrain model=opt_demo "$@"
