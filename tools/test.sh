#!/usr/bin/env bash
# The whole test suite, set-up included: venv + pip, Debian's Slurm + munge + slurmdbd, a local
# 4-node cluster (+2 GPU-GRES nodes), then ruff and pytest. Extra arguments go to pytest. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh --test
.venv/bin/python tools/slurm_cluster.py install
.venv/bin/python tools/slurm_cluster.py start --nodes 4
export SLURMTRAIN_CLUSTER_STARTED=1
# Lint and format first (pyproject.toml [tool.ruff]): a style slip fails CI like a test does.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
set +e
.venv/bin/python -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests: that is a failure" >&2
    rc=1
fi
exit "$rc"
