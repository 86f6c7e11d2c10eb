#!/usr/bin/env bash
# Time of ./setup.sh building .venv from scratch, with one pip process and with several (HNCLIP_SETUP_JOBS).
# Usage: benchmarks/setup_time.sh [JOBS ...]   (default: 1 3) -> one JSON line per JOBS value appended to
# benchmarks/results/setup_time.jsonl. Each build is a fresh copy of this checkout (~6 GB, removed after).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] || set -- 1 3
gflops() { "$here/.venv/bin/python" "$here/benchmarks/command1_costs.py" --gemm-gflops; }
for jobs in "$@"; do
  work=$(mktemp -d)
  (cd "$here" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -xf - -C "$work"
  speed_before=$(gflops); load_before=$(cut -d' ' -f1 /proc/loadavg)
  t0=$(date +%s.%N)
  (cd "$work" && HNCLIP_SETUP_JOBS=$jobs ./setup.sh >"$work/setup.out" 2>&1) || { cat "$work/setup.out"; rm -rf "$work"; exit 1; }
  t1=$(date +%s.%N)
  speed_after=$(gflops)
  PYTHONPATH="$here/benchmarks" python3 - "$t0" "$t1" "$jobs" "$(cd "$here" && git rev-parse HEAD)" "$(cd "$here" && git status --porcelain | wc -l)" \
      "$(nproc)" "$speed_before" "$speed_after" "$load_before" "$work/setup.out" >>"$here/benchmarks/results/setup_time.jsonl" <<'PY'
import datetime, json, sys
from ci_walltime import phases  # setup.sh's report lines, read as in CI's transcript
t0, t1 = map(float, sys.argv[1:3])
setup = phases([(0.0, line) for line in open(sys.argv[10]).read().splitlines()])
print(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "commit": sys.argv[4], "uncommitted_files": int(sys.argv[5]), "cpus": int(sys.argv[6]),
                  "pip_processes": int(sys.argv[3]), "wall_s": round(t1 - t0, 1),
                  "install_s": setup["install_s"], "compile_s": setup["compile_s"],
                  "gemm_gflops_1thread": {"before": float(sys.argv[7]), "after": float(sys.argv[8])},
                  "loadavg_before_1min": float(sys.argv[9])}))
PY
  rm -rf "$work"
  tail -n 1 "$here/benchmarks/results/setup_time.jsonl"
done
