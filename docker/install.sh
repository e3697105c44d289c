#!/bin/sh
# Install shardflow from a source tree into the Python environment that owns $PIP.
# docker/Dockerfile runs this, and so does tests/cluster/test_docker_install.py (in CI), so the image's
# install steps are exercised without a Docker engine.
#
#   docker/install.sh [SRC]        SRC: the source tree (default: .)
#   EXTRAS  comma-separated extras of shardflow (default: s3,gcs; empty for none)
#   TORCH   1: add the torch stack, pinned in pyproject's `torch` extra, as CPU wheels from
#           PyTorch's official index (TORCH_INDEX)
#   CUDA    a PyTorch CUDA wheel tag (cu126, cu128, ...): the torch stack as CUDA wheels from
#           https://download.pytorch.org/whl/$CUDA (implies TORCH=1; see docs/gpu.md)
#   PIP     the pip command (default: pip)
set -eu
SRC="${1:-.}"
PIP="${PIP:-pip}"
EXTRAS="${EXTRAS-s3,gcs}"
TORCH="${TORCH:-0}"
CUDA="${CUDA:-}"
if [ -n "$CUDA" ]; then
  TORCH=1
  TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/$CUDA}"
fi
TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"

CONSTRAINTS=""
if [ -f "$SRC/constraints.txt" ]; then
  CONSTRAINTS="--constraint $SRC/constraints.txt"
fi

if [ "$TORCH" = "1" ]; then
  # the exact pins of the `torch` extra (torch==..., torchvision==...); +cpu wheels win over the
  # default index's CUDA builds of the same version
  PINS=$(python3 -c 'import sys, tomllib; p = tomllib.load(open(sys.argv[1], "rb")); print(" ".join(p["project"]["optional-dependencies"]["torch"]))' "$SRC/pyproject.toml")
  # shellcheck disable=SC2086
  $PIP install $CONSTRAINTS --extra-index-url "$TORCH_INDEX" $PINS
  EXTRAS="${EXTRAS:+$EXTRAS,}torch"
fi

# shellcheck disable=SC2086
$PIP install $CONSTRAINTS "$SRC${EXTRAS:+[$EXTRAS]}"
