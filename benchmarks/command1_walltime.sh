#!/usr/bin/env bash
# Wall time of README command 1 on a fresh clone: cold (nothing built) and no-op (second run).
# Usage: benchmarks/command1_walltime.sh [clone-dir]   -> appends a JSON line to benchmarks/results/command1.jsonl
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d)/hnclip-repro}
# Reuse the project's venv (building it is measured separately by setup.sh's own log): bring it up
# to date first, or the clone's setup.sh would replace the link with a fresh venv inside the timing.
(cd "$here" && ./setup.sh >/dev/null)
git clone -q "$here" "$work"
ln -s "$here/.venv" "$work/.venv"
cd "$work"
# the linked venv installs hnclip editable from $here/src: the clone's own source must win, or the run
# would execute (and record as the clone's commit) whatever the main checkout holds uncommitted
export PYTHONPATH="$work/src"
export DVC_NO_ANALYTICS=1
# This VM's speed drifts (the same GEMM ran at 75 and at 42 GFLOPS an hour apart): record it with the time.
gflops() { "$here/.venv/bin/python" "$here/benchmarks/command1_costs.py" --gemm-gflops; }
speed_before=$(gflops)
t0=$(date +%s.%N); ./setup.sh >/dev/null && .venv/bin/dvc repro >"$work/cold.log" 2>&1; t1=$(date +%s.%N)
./setup.sh >/dev/null && .venv/bin/dvc repro >"$work/noop.log" 2>&1; t2=$(date +%s.%N)
speed_after=$(gflops)
python3 - "$t0" "$t1" "$t2" "$(git rev-parse HEAD)" "$(nproc)" "$speed_before" "$speed_after" \
    >>"$here/benchmarks/results/command1.jsonl" <<'PY'
import json, sys, datetime
t0, t1, t2 = map(float, sys.argv[1:4])
print(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "commit": sys.argv[4], "cpus": int(sys.argv[5]),
                  "cold_s": round(t1 - t0, 1), "noop_s": round(t2 - t1, 1),
                  "gemm_gflops_1thread": {"before": float(sys.argv[6]), "after": float(sys.argv[7])}}))
PY
# where the cold run's time went, and the least time its training compute allows
"$here/.venv/bin/python" "$here/benchmarks/command1_costs.py" --project "$work" --cold-s "$(python3 -c "print($t1 - $t0)")" >/dev/null
tail -n 1 "$here/benchmarks/results/command1.jsonl"
