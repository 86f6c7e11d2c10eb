#!/usr/bin/env bash
# Wall time of the paper profile's rehearsal (scripts/paper_rehearsal.sh) on a fresh copy of this checkout
# (its tracked and untracked, not ignored files; the project's .venv linked), with the machine's state.
# Usage: benchmarks/rehearsal_walltime.sh [copy-dir [SNAKEMAKE ARGS...]]   -> appends a JSON line to
# benchmarks/results/rehearsal.jsonl: wall time, the CPU seconds of the run's process tree and of the whole
# machine (jobs forked from the warm server are outside the tree; on a quiet machine the machine's count
# is the run's), job seconds per rule, and the Snakemake arguments added (e.g. `--scheduler ilp`).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d)/hnclip-repro}
shift $(( $# > 0 ? 1 : 0 ))
snakemake_args=("$@")
mkdir -p "$work"
(cd "$here" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -xf - -C "$work"
ln -s "$here/.venv" "$work/.venv"
cd "$work"
gflops() { "$here/.venv/bin/python" "$here/benchmarks/command1_costs.py" --gemm-gflops; }
speed_before=$(gflops); load_before=$(cut -d' ' -f1 /proc/loadavg)
# busy CPU seconds of the machine (user, nice, system, irq, softirq, steal ticks of /proc/stat's cpu line)
machine_cpu() { awk -v hz="$(getconf CLK_TCK)" '/^cpu /{print ($2+$3+$4+$7+$8+$9)/hz}' /proc/stat; }
cpu0=$(machine_cpu)
t0=$(date +%s.%N)
/usr/bin/time -f "%U %S" -o "$work/rehearsal.cpu" scripts/paper_rehearsal.sh ${snakemake_args[@]+-- "${snakemake_args[@]}"} \
    >"$work/rehearsal.log" 2>&1 || { tail -20 "$work/rehearsal.log"; exit 1; }
t1=$(date +%s.%N); cpu1=$(machine_cpu)
speed_after=$(gflops); load_after=$(cut -d' ' -f1-3 /proc/loadavg)
"$here/.venv/bin/python" - "$t0" "$t1" "$(cd "$here" && git rev-parse HEAD)" "$(cd "$here" && git status --porcelain | wc -l)" \
    "$(nproc)" "$speed_before" "$speed_after" "$load_before" "$load_after" "$work" "$cpu0" "$cpu1" \
    "${snakemake_args[*]-}" \
    >>"$here/benchmarks/results/rehearsal.jsonl" <<'PY'
import collections, datetime, json, sys
from pathlib import Path
t0, t1 = map(float, sys.argv[1:3])
work = Path(sys.argv[10])
jobs = collections.Counter()  # job seconds per rule, from Snakemake's benchmark files
for tsv in work.glob("logs/**/*.benchmark.tsv"):
    parts = tsv.relative_to(work / "logs").parts
    rule = {"train": "train", "evals": "evaluate"}.get(parts[0]) or (parts[1] if len(parts) > 2 else parts[-1].split(".")[0])
    jobs[rule] += float(tsv.read_text().splitlines()[-1].split("\t")[0])
print(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "commit": sys.argv[3], "uncommitted_files": int(sys.argv[4]), "cpus": int(sys.argv[5]),
                  "wall_s": round(t1 - t0, 1),
                  "snakemake_args": sys.argv[13].split() if sys.argv[13] else [],
                  # user + system CPU seconds: the rehearsal's process tree, and the whole machine meanwhile
                  "cpu_s": {"process_tree": round(sum(map(float, (work / "rehearsal.cpu").read_text().split()[-2:])), 1),
                            "machine": round(float(sys.argv[12]) - float(sys.argv[11]), 1)},
                  "gemm_gflops_1thread": {"before": float(sys.argv[6]), "after": float(sys.argv[7])},
                  "loadavg": {"before_1min": float(sys.argv[8]), "after_1_5_15min": sys.argv[9]},
                  "job_s_by_rule": {rule: round(s, 1) for rule, s in jobs.most_common()},
                  "job_s_total": round(sum(jobs.values()), 1)}))
PY
grep -q "snakemake exited 0" "$work/rehearsal.log" || { tail -20 "$work/rehearsal.log"; exit 1; }
tail -n 1 "$here/benchmarks/results/rehearsal.jsonl"
