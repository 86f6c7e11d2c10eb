#!/usr/bin/env bash
# Idempotent setup: (re)creates .venv from requirements.lock, reusing it while the lock is unchanged.
#   HNCLIP_SETUP_JOBS=N   pip processes installing the lock side by side (default 3; 1 = one pip)
#   HNCLIP_TORCH_BUILD=B  the torch build: cu130 (default: the lock's own, PyPI's CUDA 13.0 build, which needs an
#                         NVIDIA driver >= 580.65.06), cu128 (CUDA 12.8: driver >= 570.26) or cpu (no GPU). cu128
#                         and cpu replace the lock's torch, torchvision, triton and CUDA wheels with that build of
#                         the same torch release from PyTorch's index, HNCLIP_TORCH_INDEX/B (default
#                         https://download.pytorch.org/whl/B; a download of ~1-3 GB). docs/paper-run.md
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
JOBS=${HNCLIP_SETUP_JOBS:-3}
BUILD=${HNCLIP_TORCH_BUILD:-cu130}
TORCH_INDEX=${HNCLIP_TORCH_INDEX:-https://download.pytorch.org/whl}
stamp=.venv/.lock-sha256
case $BUILD in cu130|cu128|cpu) ;; *) echo "setup: HNCLIP_TORCH_BUILD must be cu130, cu128 or cpu, not '$BUILD'"; exit 2;; esac
# The lock's own pins are the cu130 build; another build's torch pins and what they replace (the CUDA 13 wheels).
CUDA_PINS='^(torch|torchvision|triton|cuda-[a-z-]+|nvidia-(c[a-z0-9-]+|nccl[a-z0-9-]*|nvjitlink|nvshmem[a-z0-9-]*|nvtx))=='
# Where PYTHONDONTWRITEBYTECODE is set (common in containers) Python never caches what it compiles, and
# every process compiles what it imports from source again (`import open_clip`: 16 s instead of 6.5;
# benchmarks/import_times.py). So the packages are byte-compiled once, when installed, and the
# project's own modules on every setup (importing the trainer: 0.5 s less per job; when nothing
# changed, a no-op).
compile_project() { .venv/bin/python -m compileall -qq -j 0 src >/dev/null 2>&1 || true; }
want=$(sha256sum requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1)
[ "$BUILD" = cu130 ] || want="$want-$BUILD"   # the default build's stamp is the lock's hash alone
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  compile_project
  echo "setup: .venv is up to date with requirements.lock"
  exit 0
fi
case $JOBS in ''|*[!0-9]*|0) echo "setup: HNCLIP_SETUP_JOBS must be a positive integer, not '$JOBS'"; exit 2;; esac
echo "setup: building .venv from requirements.lock (first time: ~1.5 min, ~6 GB; torch comes from the local wheel cache)"
[ "$BUILD" = cu130 ] || echo "setup: torch build $BUILD from $TORCH_INDEX/$BUILD instead of the lock's CUDA 13.0 wheels"
rm -rf .venv
"$PY" -m venv .venv
log=.venv/setup.log
start=$SECONDS
# The lock pins every package (pip freeze --all), so nothing is left to resolve: JOBS pip processes each
# install every JOBS-th line with --no-deps, side by side, since one pip waits on the network for each
# small download and unpacks the large wheels on one core. `pip check` below verifies the whole set.
# --no-compile: modules are byte-compiled below, on every core.
parts=.venv/lock-parts
mkdir -p "$parts"
if [ "$BUILD" = cu130 ]; then
  grep -Ev '^[[:space:]]*(#|$)' requirements.lock
else
  grep -Ev '^[[:space:]]*(#|$)' requirements.lock | grep -Ev "$CUDA_PINS" || true
fi | split -n "r/$JOBS" - "$parts/part-"
pids=() part_files=()
for part in "$parts"/part-*; do
  [ -s "$part" ] || continue
  .venv/bin/pip install --no-input --no-compile --no-deps -r "$part" >"$part.log" 2>&1 &
  pids+=($!) part_files+=("$part")
done
failed=()
for i in "${!pids[@]}"; do wait "${pids[$i]}" || failed+=("${part_files[$i]}"); done
for part in "${part_files[@]}"; do cat "$part.log" >>"$log"; done
if [ ${#failed[@]} -gt 0 ]; then
  for part in "${failed[@]}"; do grep -v '^WARNING: Location' "$part.log" | tail -n 30; done
  echo "setup: pip install failed (full log: $log)"; exit 1
fi
rm -rf "$parts"
if [ "$BUILD" != cu130 ]; then
  # The same torch and torchvision releases in the chosen build, with the dependencies that build pins (its
  # own CUDA wheels, triton); `pip check` below verifies the whole set again.
  torch_pins=$(grep -E '^(torch|torchvision)==' requirements.lock | sed "s/\$/+$BUILD/")
  # shellcheck disable=SC2086  # one argument per pin
  .venv/bin/pip install --no-input --no-compile --index-url "$TORCH_INDEX/$BUILD" $torch_pins >>"$log" 2>&1 || {
    tail -n 30 "$log"; echo "setup: installing torch build $BUILD from $TORCH_INDEX/$BUILD failed (full log: $log)"; exit 1; }
fi
.venv/bin/pip install --no-input --no-compile --no-deps -e . >>"$log" 2>&1 || { tail -n 30 "$log"; exit 1; }
.venv/bin/pip check >>"$log" 2>&1 || { tail -n 30 "$log"; echo "setup: pip check failed: requirements.lock is not a complete, consistent pin set"; exit 1; }
echo "setup: packages installed in $((SECONDS - start)) s ($JOBS pip processes)"
start=$SECONDS
# Byte-compiled on every core, but for the packages' own test suites and transformers' model families
# that nothing here imports (a module left out is compiled when imported); a handful of test files use
# newer syntax and do not compile.
.venv/bin/python -m compileall -qq -j 0 -x '/tests?/|/transformers/models/(?!auto/|bloom/|clip/|encoder_decoder/)[^/]+/' \
    .venv/lib/python3*/site-packages >>"$log" 2>&1 || true
compile_project
echo "setup: byte-compiled in $((SECONDS - start)) s"
echo "$want" > "$stamp"
echo "setup: done"
