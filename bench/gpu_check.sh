#!/usr/bin/env bash
# One prepared GPU check for a 1-GPU machine without internet (under 10 minutes).
#
#   bench/gpu_check.sh --fetch   # here, with a package index: fill bench/.whl/ (once; ~20 MB)
#   bench/gpu_check.sh           # on the GPU machine: install what is missing, run the checks
#   bench/gpu_check.sh --dry     # the same script on this machine's CPU with opt_tiny
#
# The GPU image has Python 3.12, torch (CUDA) and transformers 5.x but not deepspeed, hydra-core,
# omegaconf, the antlr4 runtime, submitit or accelerate. --fetch downloads the wheels for Python 3.12
# (pure-Python ones, and manylinux x86_64 for the few compiled ones) and builds deepspeed's and
# antlr4's from their source distributions with `pip wheel`, all without dependencies (the list
# below is the closure minus what the image has). On the GPU machine the script makes a venv that
# sees the image's packages (--system-site-packages), installs only the wheels whose distribution
# is missing (--no-deps --no-index), then the checkout itself editable (--no-deps
# --no-build-isolation: setuptools' editable finder maps slurmtrain.conf to conf/), and runs
# bench/gpu_check.py: tokens/s per GPU, TFLOP/s, MFU, peak memory measured vs planned for opt125m
# and opt1.3b (bf16, seq 2048, ZeRO-2 and ZeRO-3), a bitwise resume check, a binding check.
# bench/.whl is git-ignored: carry it with the checkout (the device tool's `carry`).
set -euo pipefail
cd "$(dirname "$0")/.."
WHL=bench/.whl
PY=${PYTHON:-python3}
PURE=(
  hydra-core==1.3.8 omegaconf==2.3.1 submitit==1.5.4 cloudpickle==3.1.3 accelerate==1.16.0
  hjson==3.1.0 py-cpuinfo==9.0.0 einops==0.8.2 pydantic==2.14.4 annotated-types==0.8.0
  typing-inspection==0.4.5 typing_extensions==4.16.0 rich==15.0.0 markdown-it-py==4.3.0
  mdurl==0.1.2 pygments==2.21.0 jinja2==3.1.6 packaging==26.4 setuptools==84.2.1 wheel==0.48.0
)
COMPILED=(pydantic_core==2.50.5 msgpack==1.2.4 ninja==1.13.2 psutil==7.2.2 pyyaml==6.0.4
  markupsafe==3.0.4)
SDIST=(deepspeed==0.19.8 antlr4-python3-runtime==4.9.3)

case "${1:-}" in
--fetch)
  mkdir -p "$WHL"
  "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --abi none --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any \
    -d "$WHL" "${PURE[@]}" "${COMPILED[@]}"
  # deepspeed's setup.py imports torch: build against this environment's (no ops are prebuilt).
  DS_BUILD_OPS=0 "$PY" -m pip wheel --no-deps --no-build-isolation -w "$WHL" "${SDIST[@]}"
  ls -1 "$WHL"
  du -sh "$WHL"
  exit 0
  ;;
--dry)
  # This machine's environment already has everything: only the checks, on CPU.
  exec env DS_ACCELERATOR=cpu PYTHONWARNINGS=ignore SLURMTRAIN_AUTO=off \
    "$PY" bench/gpu_check.py --dry --out "${OUT:-/tmp}/gpu_check_dry.json"
  ;;
"") ;;
*)
  echo "usage: bench/gpu_check.sh [--fetch|--dry]" >&2
  exit 2
  ;;
esac

[ -d "$WHL" ] || { echo "bench/gpu_check.sh: no $WHL: run bench/gpu_check.sh --fetch where pip can reach an index, and bring $WHL along" >&2; exit 2; }
nvidia-smi -L || true
ENV=${GPU_CHECK_VENV:-/tmp/gpu_check_venv}
"$PY" -m venv --system-site-packages "$ENV"
VPY="$ENV/bin/python"
missing=()
for w in "$WHL"/*.whl; do
  dist=$(basename "$w" | cut -d- -f1)
  if ! "$VPY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2>/dev/null; then
    missing+=("$w")
  fi
done
echo "installing ${#missing[@]} missing wheels: ${missing[*]##*/}"
[ ${#missing[@]} -eq 0 ] || "$VPY" -m pip install -q --no-deps --no-index "${missing[@]}"
"$VPY" -m pip install -q --no-deps --no-build-isolation --no-index -e .
"$VPY" -c "import torch, transformers, deepspeed, hydra, submitit; print('torch', torch.__version__, 'transformers', transformers.__version__, 'deepspeed', deepspeed.__version__)"
export PYTHONWARNINGS=ignore SLURMTRAIN_AUTO=off
exec timeout 570 "$VPY" bench/gpu_check.py --out "${OUT:-/tmp}/gpu_check.json"
