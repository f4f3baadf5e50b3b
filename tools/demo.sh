#!/usr/bin/env bash
# The embedded default end to end: set-up, then 2 local workers train a tiny OPT with DeepSpeed.
# Extra arguments are Hydra overrides: tools/demo.sh train.max_steps=400
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python -m slurmtrain "$@"
