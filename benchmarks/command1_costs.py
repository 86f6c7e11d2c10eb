"""Where command 1's time goes, and the least time its training compute allows.

    python benchmarks/command1_costs.py [--project DIR] [--cores N] [--cold-s S]
    python benchmarks/command1_costs.py --gemm-gflops      # this machine's single-thread speed now

Run after README command 1 (or `benchmarks/command1_walltime.sh`, whose clone it can read with
--project). It reads the per-job Snakemake benchmark files (logs/<rule>/**/*.benchmark.tsv: each job's
wall time) and the training records (results/runs/<run>/train.json: the loop's own split of a run into
optimizer steps, per-epoch evaluation and gradient probes), and appends one JSON line to
benchmarks/results/command1_costs.jsonl:

* job seconds per stage (train, evals, backbones, auxiliary, data, tables, ...), and for training per
  framework: optimizer steps, evaluation, probes and the rest of the job (start-up, data loading,
  checkpoints, records);
* `steps_bound_s`: backbone pretraining (a job every other job waits for) plus the fine-tuning runs'
  optimizer-step seconds shared perfectly over the cores. No overhead removed and no scheduling can
  bring a cold command 1 below it; only a cheaper experiment (fewer or smaller runs, a smaller model)
  can. `compute_bound_s` adds the per-epoch evaluations the tables and figures are computed from, and the
  paired step timing (rule step_timing), which takes every core by design (it measures, so nothing may
  share the machine with it) and so adds its whole wall time;
  `matrix_steps_bound_s` is `steps_bound_s` of every run params.yaml plans, each framework's planned
  micro-batches at the step cost measured on its finished runs (so a partial run bounds the whole).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "command1_costs.jsonl"


TOP_LEVEL_STAGES = ("train", "evals", "backbones")  # logs/<stage>/...; every other rule logs under logs/<profile>/


def stage_of(relative: Path) -> str:
    """The stage of a benchmark file from its path under logs/: train, evals, backbones, or the folder
    (auxiliary, data, tables, ...) or file stem (claims, metrics) under logs/<profile>/."""
    parts = relative.parts
    if parts[0] in TOP_LEVEL_STAGES:
        return parts[0]
    return parts[1] if len(parts) > 2 else parts[1].split(".")[0]


def job_seconds(project: Path) -> dict[str, dict[str, float]]:
    """{stage: {benchmark file (relative to logs/): the job's wall seconds}}."""
    jobs: dict[str, dict[str, float]] = defaultdict(dict)
    logs = project / "logs"
    for path in sorted(logs.glob("**/*.benchmark.tsv")):
        with path.open() as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        if rows:
            relative = path.relative_to(logs)
            jobs[stage_of(relative)][str(relative)] = float(rows[-1]["s"])
    return dict(jobs)


def training_split(project: Path, train_jobs: dict[str, float]) -> dict[str, dict]:
    """Per framework: runs, micro-batches and job seconds split into steps / eval / probe / other."""
    split: dict[str, dict] = defaultdict(lambda: {"runs": 0, "micro_batches": 0, "job_s": 0.0, "steps_s": 0.0,
                                                  "eval_s": 0.0, "probe_s": 0.0, "other_s": 0.0})
    for record_path in sorted((project / "results" / "runs").glob("*/train.json")):
        record = json.loads(record_path.read_text())
        run = record_path.parent.name
        training = record.get("training", {})
        timing = training.get("timing_s", {})
        job = train_jobs.get(f"train/{run}.benchmark.tsv", record.get("wall_time_s", 0.0))
        entry = split[training.get("framework", "full")]
        probe, evaluation = timing.get("probe_s", 0.0), timing.get("eval_s", 0.0)
        steps = timing.get("train_s", 0.0) - probe  # the loop times a probe inside its optimizer step
        entry["runs"] += 1
        entry["micro_batches"] += sum(h["train"]["micro_batches"] for h in record.get("history", []))
        entry["job_s"] += job
        entry["steps_s"] += steps
        entry["eval_s"] += evaluation
        entry["probe_s"] += probe
        entry["other_s"] += job - steps - probe - evaluation
    for entry in split.values():
        batches = entry["micro_batches"]
        entry["ms_per_micro_batch"] = 1000 * entry["steps_s"] / batches if batches else None
    return dict(split)


def planned_micro_batches(project: Path) -> dict[str, int]:
    """Micro-batches per framework of every run the project's params.yaml plans (its active profile), as
    the loop counts them: the run's training subset, the incomplete tail dropped, times epochs."""
    from hnclip.config.params import load_params
    from hnclip.config.registry import Registry
    from hnclip.data.loader import subset_indices
    reg = Registry(load_params(project / "params.yaml"), validate=False)
    planned: dict[str, int] = defaultdict(int)
    for run_id in reg.runs():
        spec = reg.run(run_id).spec
        pairs = len(subset_indices(spec["dataset"]["sizes"]["train"], spec["fraction"]))  # the loop's subset
        planned[spec["objective"]["framework"]] += pairs // spec["recipe"]["micro_batch"] * spec["recipe"]["epochs"]
    return dict(planned)


def matrix_steps_bound(frameworks: dict[str, dict], planned: dict[str, int], pretrain_s: float,
                       cores: int) -> float | None:
    """`steps_bound_s` of the whole planned matrix from the runs measured so far (a partial command 1
    is enough): each framework's planned micro-batches at its measured step cost. None while a
    planned framework has no measured run."""
    if any(not frameworks.get(name, {}).get("micro_batches") for name in planned):
        return None
    steps = sum(n * frameworks[name]["steps_s"] / frameworks[name]["micro_batches"] for name, n in planned.items())
    return round(pretrain_s + steps / cores, 1)


def summarise(project: Path, cores: int, cold_s: float | None = None) -> dict:
    jobs = job_seconds(project)
    frameworks = training_split(project, jobs.get("train", {}))
    pretrain_s = sum(jobs.get("backbones", {}).values())
    exclusive_s = sum(s for name, s in jobs.get("stats", {}).items() if Path(name).name.startswith("step_timing."))
    steps_s = sum(f["steps_s"] for f in frameworks.values())
    eval_s = sum(f["eval_s"] for f in frameworks.values())
    total_job_s = sum(sum(rule.values()) for rule in jobs.values())
    summary = {
        "cores": cores,
        "stages": {stage: {"jobs": len(times), "job_s": round(sum(times.values()), 1)}
                   for stage, times in sorted(jobs.items())},
        "training": {name: {k: round(v, 1) if isinstance(v, float) else v for k, v in entry.items()}
                     for name, entry in sorted(frameworks.items())},
        "total_job_s": round(total_job_s, 1),
        "pretrain_s": round(pretrain_s, 1),
        "steps_bound_s": round(pretrain_s + steps_s / cores, 1),
        "step_timing_s": round(exclusive_s, 1),
        "compute_bound_s": round(pretrain_s + exclusive_s + (steps_s + eval_s) / cores, 1),
    }
    if (project / "params.yaml").is_file():
        planned = planned_micro_batches(project)
        summary["planned_micro_batches"] = planned
        summary["matrix_steps_bound_s"] = matrix_steps_bound(frameworks, planned, pretrain_s, cores)
    if cold_s is not None:
        summary["cold_s"] = cold_s
        summary["core_utilisation"] = round((total_job_s - pretrain_s) / (cores * max(cold_s - pretrain_s, 1e-9)), 3)
    return summary


def gemm_gflops(seconds: float = 2.0) -> float:
    """Single-thread GFLOPS of a fine-tuning-shaped matmul (2,080 tokens x width 128 -> 512): how fast
    this machine is right now, so cold times measured on a drifting VM can be compared."""
    import time

    import torch
    torch.set_num_threads(1)
    a, b = torch.randn(2080, 128), torch.randn(128, 512)
    for _ in range(5):
        a @ b
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        a @ b
        runs += 1
    return round(2 * 2080 * 128 * 512 * runs / (time.perf_counter() - started) / 1e9, 1)


def _commit(project: Path) -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project, capture_output=True, text=True)
    return done.stdout.strip() or None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, default=ROOT, help="a project after command 1 (default: this one)")
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="the cores command 1 ran on")
    parser.add_argument("--cold-s", type=float, help="the measured cold wall time (command1.jsonl), for utilisation")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--gemm-gflops", action="store_true", help="print this machine's single-thread GFLOPS and exit")
    args = parser.parse_args(argv)
    if args.gemm_gflops:
        print(gemm_gflops())
        return {}
    if not (args.project / "logs").is_dir():
        parser.error(f"{args.project}/logs does not exist: run README command 1 there first")
    return append_record(args.out, {"benchmark": "command1_costs", "timestamp": utc_now(),
                                    "commit": _commit(args.project), "gemm_gflops_1thread": gemm_gflops(),
                                    **summarise(args.project, args.cores, args.cold_s)})


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def append_record(out: Path, record: dict) -> dict:
    """Append `record` as one JSON line to `out` (created with its folder), print it and return it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    print(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()
