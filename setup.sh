#!/usr/bin/env bash
# Idempotent setup: (re)creates .venv from requirements.lock, reusing it while the lock is unchanged.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
stamp=.venv/.lock-sha256
want=$(sha256sum requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup: .venv is up to date with requirements.lock"
  exit 0
fi
echo "setup: building .venv from requirements.lock (first time: ~3 min, ~6 GB; torch comes from the local wheel cache)"
rm -rf .venv
"$PY" -m venv .venv
log=.venv/setup.log
# --no-compile: pip compiles on one core; all modules are byte-compiled below, in parallel.
if ! .venv/bin/pip install --no-input --no-compile -r requirements.lock >"$log" 2>&1; then
  grep -v '^WARNING: Location' "$log" | tail -n 30; echo "setup: pip install failed (full log: $log)"; exit 1
fi
.venv/bin/pip install --no-input --no-compile --no-deps -e . >>"$log" 2>&1 || { tail -n 30 "$log"; exit 1; }
.venv/bin/pip check >>"$log" 2>&1 || { tail -n 30 "$log"; echo "setup: pip check failed"; exit 1; }
# Byte-compile once, on every core (~35 s on two): where PYTHONDONTWRITEBYTECODE is set (common in
# containers) Python never caches what it compiles, and every process would compile what it imports
# from source again (`import open_clip`: 16 s instead of 6.5; benchmarks/import_times.py). A handful
# of files in the packages' own test suites use newer syntax and do not compile; nothing imports them.
.venv/bin/python -m compileall -qq -j 0 .venv/lib/python3*/site-packages >>"$log" 2>&1 || true
echo "$want" > "$stamp"
echo "setup: done"
