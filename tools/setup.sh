#!/usr/bin/env bash
# Create .venv and install slurmtrain into it (idempotent). Usage: tools/setup.sh [--test]
# torch is pinned exactly (pyproject.toml): any looser spec would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
stamp=".venv/.installed$extras"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    # pip's and the build backend's chatter goes to a log; it is shown when the install fails
    log=.venv/pip-install.log
    echo "setup: installing slurmtrain$extras into .venv (pip's log: $log)"
    if ! { .venv/bin/python -m pip install --quiet --upgrade pip setuptools wheel &&
        .venv/bin/python -m pip install --quiet -e ".$extras"; } >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "setup: pip install failed; the whole log is $log" >&2
        exit 1
    fi
    touch "$stamp"
fi
.venv/bin/python -c "import slurmtrain, torch, deepspeed, hydra, submitit; print('setup: ok, torch', torch.__version__, 'deepspeed', deepspeed.__version__)"
