#!/usr/bin/env bash
# The whole test suite, set-up included: venv + pip, Debian's Slurm + munge + slurmdbd, a local
# 4-node cluster (+2 GPU-GRES nodes, +18 in partition big for the 16-node scale drill: ~6 MB per
# idle slurmd), then ruff and pytest. Extra arguments go to pytest. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh --test
.venv/bin/python tools/slurm_cluster.py install
.venv/bin/python tools/slurm_cluster.py start --nodes 4 --gpu-nodes 2 --big-nodes 18
export SLURMTRAIN_CLUSTER_STARTED=1
# The OCI image for tests/cluster/test_containers.py, cached per machine (~10 min when its inputs
# change, seconds otherwise): built beside lint and the unit tests; the tests' fixture waits on it.
apt-get install -y -qq debootstrap runc >/dev/null
bash tools/build_image.sh >/tmp/slurmtrain-image-build.log 2>&1 &
# Lint, format and types first (pyproject.toml [tool.ruff], [tool.mypy]): a style slip or a type
# error fails CI like a test does. The Any count is printed, not enforced: what mypy cannot see.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m mypy
.venv/bin/python tools/count_any.py
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
# The whole suite, in two streams. tests/cluster, one test at a time (they share the cluster: a
# killed node or a restarted controller is every job's), in the foreground. Beside it, the pure
# unit tests and then tests/local: cluster=local runs, no Slurm, rendezvous ports from the kernel's
# ephemeral range while Slurm jobs take theirs below it. The cluster tests' time is mostly Slurm's
# and the jobs' waits (injected step delays, time limits, node timeouts), so the two streams share
# the 2 cores without slowing each other much; their outputs follow, one after the other.
side_log=$(mktemp)
side() {
    local unit_rc local_rc
    .venv/bin/python -m pytest -q -p no:cacheprovider tests/unit
    unit_rc=$?
    .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 tests/local
    local_rc=$?
    pytest_rc "$unit_rc" && pytest_rc "$local_rc"
}
side >"$side_log" 2>&1 &
side_pid=$!
.venv/bin/python -m pytest -q --durations=25 tests/cluster
pytest_rc $?
cluster=$?
wait "$side_pid"
side_rc=$?
echo "---- tests/unit, then tests/local ----"
cat "$side_log"
if [ "$cluster" -ne 0 ] || [ "$side_rc" -ne 0 ]; then
    exit 1
fi
exit 0
