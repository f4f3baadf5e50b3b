#!/usr/bin/env bash
# The prepared GPU check for a 1-GPU machine without a package index (8 minutes of an H100).
#
#   bench/gpu_check.sh --fetch   # here, with a package index: fill .whl/ (once; git-ignored)
#   bench/gpu_check.sh           # on the GPU machine, from the carried checkout (carry .whl)
#   bench/gpu_check.sh --cpu     # the whole script on this machine's CPU (CI runs it)
#   bench/gpu_check.sh --dry     # here: every run it would start, each asked of the planner for
#                                # an 80 GB and a 141 GB card, with its timeout (sum <= 450 s)
#
# Arguments after the first go to bench/gpu_check.py (e.g. --extras, --only n1,throughput).
# The GPU image's python3 is itself a virtual environment holding torch (CUDA) and transformers:
# no venv is made from it (one would hide its torch). The missing packages travel as wheels in
# .whl/ and go into /tmp/site with `pip --target`; the checkout itself is built into a wheel there
# too (pyproject maps conf/ into the package), and PYTHONPATH=/tmp/site. Results: one JSON line
# per measurement, as it is made, in $OUT/gpu_check.jsonl (or /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
WHL=.whl
PY=${PYTHON:-python3}
RESULTS="${OUT:-/tmp}/gpu_check.jsonl"
# What the GPU image lacks (its package list: /work/.library/device/KINDS.md), with their own
# dependencies that it lacks too; pinned to what this project's CI uses.
WHEELS=(hydra-core==1.3.8 omegaconf==2.3.1 submitit==1.5.4 hjson==3.1.0 pydantic==2.14.4
  pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5)
SDIST=(deepspeed==0.19.8 antlr4-python3-runtime==4.9.3)

case "${1:-}" in
--fetch)
  mkdir -p "$WHL"
  "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --abi none --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$WHL" "${WHEELS[@]}"
  # deepspeed's setup.py imports torch: build against this environment's (no ops are prebuilt).
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WHL" "${SDIST[@]}"
  ls -1 "$WHL"
  du -sh "$WHL"
  exit 0
  ;;
--cpu | --dry)
  # This machine's environment (the set-up .venv) has everything: the same checks on CPU, or
  # the plan alone (no torch import: the planner in this process, about 2 s).
  [ -n "${PYTHON:-}" ] || { [ -x .venv/bin/python ] && PY=.venv/bin/python; }
  if [ "$1" = --dry ]; then
    shift
    exec env SLURMTRAIN_AUTO=off "$PY" bench/gpu_check.py --dry "$@"
  fi
  shift
  exec env DS_ACCELERATOR=cpu PYTHONWARNINGS=ignore SLURMTRAIN_AUTO=off \
    "$PY" bench/gpu_check.py --cpu --out "$RESULTS" "$@"
  ;;
"" | -*) ;;
*)
  echo "usage: bench/gpu_check.sh [--fetch|--cpu|--dry] [gpu_check.py's options]" >&2
  exit 2
  ;;
esac

[ -d "$WHL" ] || { echo "bench/gpu_check.sh: no $WHL/: run bench/gpu_check.sh --fetch where pip reaches an index, and carry $WHL" >&2; exit 2; }
nvidia-smi -L || true
SITE=/tmp/site
missing=()
for w in "$WHL"/*.whl; do
  dist=$(basename "$w" | cut -d- -f1)
  "$PY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2>/dev/null || missing+=("$w")
done
echo "installing ${#missing[@]} missing wheels into $SITE: ${missing[*]##*/}"
[ ${#missing[@]} -eq 0 ] || "$PY" -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target "$SITE" "${missing[@]}"
build=$(mktemp -d)
"$PY" -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$build" .
"$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$build"/slurmtrain-*.whl
export PYTHONPATH="$SITE" PYTHONWARNINGS=ignore SLURMTRAIN_AUTO=off PYTHONUNBUFFERED=1
"$PY" -c "import torch, transformers, deepspeed, hydra, submitit, slurmtrain; print('torch', torch.__version__, 'transformers', transformers.__version__, 'deepspeed', deepspeed.__version__)"
# The runs' own timeouts sum to at most 450 s (bench/gpu_check_plan.py); this one is the backstop.
exec timeout 480 "$PY" bench/gpu_check.py --out "$RESULTS" "$@"
