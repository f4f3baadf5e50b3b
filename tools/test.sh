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
pytest_rc() {  # pytest's exit 5 (no tests collected) is a failure too
    local rc=$1
    if [ "$rc" -eq 5 ]; then
        echo "test.sh: pytest collected no tests: that is a failure" >&2
        rc=1
    fi
    return "$rc"
}
if [ "$#" -gt 0 ]; then  # a chosen subset: one pytest
    .venv/bin/python -m pytest -q "$@"
    pytest_rc $?
    exit $?
fi
# The whole suite. The pure unit tests (CPU only, ~1.5 min) run beside the cluster and local
# tests, whose time is mostly Slurm's and the training jobs' waits; their output follows.
unit_log=$(mktemp)
.venv/bin/python -m pytest -q -p no:cacheprovider tests/unit >"$unit_log" 2>&1 &
unit_pid=$!
.venv/bin/python -m pytest -q --durations=25 tests/local tests/cluster
pytest_rc $?
rest=$?
wait "$unit_pid"
pytest_rc $?
unit=$?
echo "---- tests/unit ----"
cat "$unit_log"
if [ "$rest" -ne 0 ] || [ "$unit" -ne 0 ]; then
    exit 1
fi
exit 0
