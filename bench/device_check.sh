#!/usr/bin/env bash
# Every check of shardflow that needs a CUDA GPU, in one call of a GPU machine lent for a few minutes.
#
# Two steps, because the GPU machine reaches no package registry and its python (3.12, with torch and
# torchvision) lacks a few of shardflow's dependencies:
#
#   bash bench/device_check.sh --wheels   # HERE: those dependencies as cp312 wheels, into .whl/ (ignored by git)
#   bash bench/device_check.sh            # THERE (the device tool's run, carry [".whl"]): the checks
#
# The checks, each under its own time limit so one that hangs leaves the others their time (about 6
# minutes in all on one H100 / H200 with 16 cores):
#   1. the GPU tests (`pytest -m gpu`): nvjpeg decode against the CPU decode, the GPU JPEG encode, a
#      device job end to end, the reader's GPU decode (tests/task/test_cuda_jobs.py, tests/reader/test_gpu_decode.py);
#   2. bench/bench_batch.py --gpu: augment_batch with nvjpeg decode + GPU encode against the CPU run of
#      the same job, images/s and how busy the GPU was;
#   3. bench/bench_reader.py --gpu: the reader's batched GPU decode against the CPU decode limit.
# Output goes to the terminal and to $OUT (the device tool brings $OUT back), one log per check.
# Exit status: that of the tests (the benches print what they measured, or why they stopped).
set -uo pipefail

PY=${PY:-python3}
OUT=${OUT:-$(mktemp -d)}
WHEELS=.whl
# the cp312 wheels of what the GPU image lacks (versions as constraints.txt pins them)
NEEDED="braceexpand cbor2 isal simplejpeg webdataset cloudpickle"

cd "$(dirname "$0")/.."

if [ "${1:-}" = "--wheels" ]; then
    mkdir -p "$WHEELS"
    pins=$(for name in $NEEDED; do grep -i "^$name==" constraints.txt; done)
    # shellcheck disable=SC2086  # one argument per pin
    exec "${HERE_PY:-.venv/bin/python}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$WHEELS" $pins
fi

export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl || { echo "device_check: the wheels in $WHEELS do not install here"; exit 3; }
    export PYTHONPATH="/tmp/site:$PWD"
fi

{
    nvidia-smi -L 2>&1 || echo "no nvidia-smi"
    "$PY" -c "import sys, torch, torchvision; print('python', sys.version.split()[0], 'torch', torch.__version__,
'torchvision', torchvision.__version__, 'cuda', torch.cuda.is_available(), torch.version.cuda)"
    nproc
} 2>&1 | tee "$OUT/environment.log"

timeout 240 "$PY" -m pytest -q -p no:cacheprovider -m gpu -rs tests/task/test_cuda_jobs.py \
    tests/reader/test_gpu_decode.py tests/codecs/test_codecs.py 2>&1 | tee "$OUT/tests.log"
status=${PIPESTATUS[0]}

if ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "device_check: no CUDA device here, so the GPU benches are not run" | tee "$OUT/benches.log"
    exit "$status"
fi
workers=$(( $(nproc) / 2 ))
timeout 180 "$PY" bench/bench_batch.py --gpu --only augment_batch --shards 4 --per-shard 128 --repeat 1 \
    --workers "$workers" 2>&1 | tee "$OUT/bench_batch.log"
timeout 150 "$PY" bench/bench_reader.py --gpu --n 4096 --repeat 1 --epochs 0 --workers "$workers" \
    --data /tmp/bench-reader --json "$OUT/bench_reader.json" 2>&1 | tee "$OUT/bench_reader.log"
exit "$status"
