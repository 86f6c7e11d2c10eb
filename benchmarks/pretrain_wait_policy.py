"""Pretraining throughput under each OpenMP wait policy, on a quiet machine and beside one busy process.

    python benchmarks/pretrain_wait_policy.py                    # 110 steps per condition (~1 min each, 2 cores)
    python benchmarks/pretrain_wait_policy.py --steps 2 --out /tmp/x.jsonl     # a smoke run

Backbone pretraining is the job every other job of command 1 waits for, and it runs with the wait policy of
params.yaml's `execution.pretrain_wait_policy` (OMP_WAIT_POLICY: ACTIVE threads spin between parallel
regions, PASSIVE ones sleep). Spinning is faster on cores of one's own and can degrade badly when another
process takes a core. This script measures both: for each policy (`--policies`), pretraining steps of the
adopted backbone (params.yaml's, its corpus and batch size; `--steps` optimizer steps in one epoch) in a
fresh process started with that policy, once on the machine as it is ("quiet") and once beside one
competing process that spins a Python loop on no pinned core ("busy"). Conditions are interleaved per
repeat, so a drift of the machine's speed touches every policy alike.

It appends one JSON line to benchmarks/results/pretrain_wait_policy.jsonl: the machine (cores, threads,
single-thread GEMM GFLOPS from `command1_costs.gemm_gflops` before and after, load average), every
condition's seconds per optimizer step (the training loop's own step timer: no start-up, evaluation or
checkpoint), and the choice: among the policies that lose at most `--max-quiet-loss` (10 %) against the
fastest quiet one, the fastest under load.

Measure on an otherwise idle machine: other work makes the "quiet" condition a loaded one.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark scripts
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "pretrain_wait_policy.jsonl"
POLICIES = ("ACTIVE", "PASSIVE")
LOADS = ("quiet", "busy")
BUSY_LOOP = "while True:\n    pass\n"
PRETRAIN_THREADS = 8  # what the pretraining rule asks for (workflow/rules/common.smk); Snakemake caps it at --cores


# ---- the child: one condition ------------------------------------------------------------------------
def child_params(steps: int, threads: int, data_root: Path) -> dict:
    """params.yaml's active profile and backbone with a corpus of exactly `steps` batches and one epoch."""
    import yaml

    from hnclip.config.params import SCHEMA_RELPATH, validate_params
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    profile = params["profiles"][params["profile"]]
    profile["data_root"] = str(data_root)
    profile["execution"] = {**profile["execution"], "threads": threads}
    backbone = params["backbones"][profile["backbone"]]
    if backbone["kind"] != "pretrained_here":
        raise SystemExit(f"profile {params['profile']!r} pretrains no backbone ({profile['backbone']} is "
                         f"{backbone['kind']}): nothing to measure")
    pretrain = backbone["pretrain"]
    pretrain["sizes"] = {"train": steps * pretrain["batch_size"], "test": pretrain["batch_size"]}
    pretrain["epochs"] = 1
    validate_params(params, ROOT / SCHEMA_RELPATH)
    return params


def run_condition(steps: int, threads: int, scratch: Path) -> dict:
    """Pretrain `steps` optimizer steps in this process (its OMP_WAIT_POLICY is the condition's)."""
    import shutil

    from hnclip.config.registry import Registry
    from hnclip.training.jobs import pretrain_job
    from hnclip.training.loop import train
    reg = Registry(child_params(steps, threads, scratch / "data"), validate=False)
    work = scratch / f"work-{os.getpid()}"
    work.mkdir(parents=True)
    os.chdir(work)  # the library's paths are relative to the project root
    try:
        job = pretrain_job(reg, reg.profile["backbone"])
        job.eval_cache_dir = None
        started = time.time()
        record = train(job)
        wall = time.time() - started
    finally:
        os.chdir(scratch)
        shutil.rmtree(work, ignore_errors=True)
    train_s = record["training"]["timing_s"]["train_s"]
    return {"omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "optimizer_steps": record["optimizer_steps"],
            "train_s": train_s, "s_per_step": train_s / record["optimizer_steps"], "job_wall_s": wall}


def build_corpus(steps: int, threads: int, scratch: Path) -> None:
    from hnclip.commands.data import build_dataset
    from hnclip.config.constants import PRETRAIN_ROLE
    from hnclip.config.registry import Registry
    reg = Registry(child_params(steps, threads, scratch / "data"), validate=False)
    build_dataset(reg, PRETRAIN_ROLE)


# ---- the parent: every condition in its own process ---------------------------------------------------
def policy_env(policy: str) -> dict:
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if policy != "unset":  # unset: the OpenMP runtime's own default
        env["OMP_WAIT_POLICY"] = policy
    return env


def measure(policy: str, load: str, steps: int, threads: int, scratch: Path) -> dict:
    busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if load == "busy" else None
    try:
        done = subprocess.run([sys.executable, __file__, "--child", "--steps", str(steps), "--threads", str(threads),
                               "--scratch", str(scratch)], env=policy_env(policy), capture_output=True, text=True)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    if done.returncode != 0:
        raise RuntimeError(f"the {policy}/{load} condition failed:\n{done.stderr[-3000:]}")
    return {"policy": policy, "load": load, **json.loads(done.stdout.strip().splitlines()[-1])}


def choose(conditions: list[dict], max_quiet_loss: float) -> dict:
    """Median seconds per step of each (policy, load), and the policy fastest under load among those within
    `max_quiet_loss` of the fastest quiet policy."""
    def median(policy: str, load: str) -> float:
        return statistics.median(c["s_per_step"] for c in conditions if (c["policy"], c["load"]) == (policy, load))
    policies = list(dict.fromkeys(c["policy"] for c in conditions))
    quiet = {p: median(p, "quiet") for p in policies}
    busy = {p: median(p, "busy") for p in policies}
    fastest_quiet = min(quiet.values())
    eligible = [p for p in policies if quiet[p] <= fastest_quiet * (1 + max_quiet_loss)]
    chosen = min(eligible, key=lambda p: busy[p])
    return {"s_per_step": {"quiet": quiet, "busy": busy},
            "quiet_loss_vs_fastest": {p: quiet[p] / fastest_quiet - 1 for p in policies},
            "busy_slowdown": {p: busy[p] / quiet[p] for p in policies},
            "eligible": eligible, "chosen": chosen,
            "rule": f"fastest under load among the policies within {max_quiet_loss:.0%} of the fastest quiet one"}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=110, help="optimizer steps per condition (default 110)")
    parser.add_argument("--threads", type=int, default=min(PRETRAIN_THREADS, os.cpu_count() or 1),
                        help="torch threads of pretraining (default: the rule's, capped at this machine's cores)")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help="comma-separated OMP_WAIT_POLICY values; 'unset' for the runtime's default")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-quiet-loss", type=float, default=0.10)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/pretrain_wait_policy"))
    parser.add_argument("--gemm-seconds", type=float, default=2.0,
                        help="how long the machine's GEMM speed is measured, before and after")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats must be positive")
    if args.child:
        result = run_condition(args.steps, args.threads, args.scratch)
        print(json.dumps(result))
        return result
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = sorted(set(policies) - {"ACTIVE", "PASSIVE", "unset"})
    if unknown or not policies:
        parser.error(f"unknown policies {unknown}; allowed: ACTIVE, PASSIVE, unset")
    from command1_costs import gemm_gflops

    from hnclip.provenance import git_state, library_versions
    args.scratch.mkdir(parents=True, exist_ok=True)
    build_corpus(args.steps, args.threads, args.scratch)
    params = child_params(args.steps, args.threads, args.scratch / "data")
    name = params["profiles"][params["profile"]]["backbone"]
    backbone = {"name": name, "model_config": params["backbones"][name]["model_config"],
                "batch_size": params["backbones"][name]["pretrain"]["batch_size"]}
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    machine = {"cpus": os.cpu_count(), "threads": args.threads, "load_average_1min": os.getloadavg()[0],
               "gemm_gflops_1thread": gemm_gflops(args.gemm_seconds)}
    conditions = []
    for repeat in range(args.repeats):
        for load in LOADS:
            for policy in policies:
                conditions.append({"repeat": repeat, **measure(policy, load, args.steps, args.threads, args.scratch)})
                print(json.dumps(conditions[-1]), file=sys.stderr)
    machine["gemm_gflops_1thread_after"] = gemm_gflops(args.gemm_seconds)
    machine["load_average_1min_after"] = os.getloadavg()[0]
    record = {"benchmark": "pretrain_wait_policy", "timestamp": started, "git": git_state(ROOT),
              "libraries": library_versions(), "steps": args.steps, "repeats": args.repeats, "backbone": backbone,
              **machine, "conditions": conditions, **choose(conditions, args.max_quiet_loss)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    print(json.dumps({k: record[k] for k in ("s_per_step", "busy_slowdown", "chosen", "gemm_gflops_1thread")},
                     indent=1))
    return record


if __name__ == "__main__":
    main()
