"""Wall time of CI on a fresh clone: `.ci/run` (README command 2: setup.sh, then the test suite) run
verbatim on a clone of the committed HEAD, with its setup and pytest phases, the outcome, the slowest
tests (pytest's `--durations`, passed through PYTEST_ADDOPTS) and the machine's speed before and after.

Usage: .venv/bin/python benchmarks/ci_walltime.py [--slowest N] [--keep]
       -> one JSON line appended to benchmarks/results/ci_walltime.jsonl; exits with `.ci/run`'s status.
Run it on a quiet machine: the suite is CPU-bound, and any other busy process lengthens it. Uncommitted
changes are not in the clone, so not measured (the record counts them).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "ci_walltime.jsonl"
CI_COMMAND = ".ci/run"
SETUP_DONE = "setup: done"  # setup.sh's last line
SETUP_PHASES = {"install_s": re.compile(r"packages installed in (\d+) s"),
                "compile_s": re.compile(r"byte-compiled in (\d+) s")}
# pytest's last line, e.g. "985 passed, 3 skipped, 1 xfailed in 617.85s (0:10:17)" (or with ==== around it)
SUMMARY = re.compile(r"^=*\s*(?P<counts>\d+ \w+(?:, \d+ \w+)*) in (?P<seconds>[\d.]+)s\b")
DURATIONS_HEADER = re.compile(r"slowest( \d+)? durations")
# one line of --durations; a test id may hold spaces (parametrized ids)
DURATION = re.compile(r"^(?P<seconds>[\d.]+)s (?P<phase>setup|call|teardown)\s+(?P<test>\S.*?)\s*$")


def run_timed(command: list[str], cwd: Path, env: dict, log: Path) -> tuple[int, list[tuple[float, str]], float]:
    """Run `command`, stamping each line of its output (stdout and stderr) with the seconds since it
    started; the stamped lines also go to `log` as they come. Returns (exit status, lines, wall seconds)."""
    started, lines = time.monotonic(), []
    with log.open("w") as out, subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        for line in proc.stdout:
            stamp = round(time.monotonic() - started, 1)
            lines.append((stamp, line.rstrip("\n")))
            out.write(f"{stamp:8.1f} {line}")
            out.flush()
    return proc.returncode, lines, round(time.monotonic() - started, 1)


def phases(lines: list[tuple[float, str]]) -> dict:
    """What a `.ci/run` transcript says: when setup ended and what it reported, pytest's outcome counts
    and seconds, and the slowest tests. A field the transcript lacks (setup or pytest did not get that
    far) is None, or empty."""
    texts = [text for _, text in lines]
    found = {name: next((int(m.group(1)) for m in map(pattern.search, texts) if m), None)
             for name, pattern in SETUP_PHASES.items()}
    summary = next((m for m in map(SUMMARY.match, reversed(texts)) if m), None)
    outcome = {}
    if summary:
        for count in summary["counts"].split(", "):
            number, what = count.split(" ", 1)
            outcome[what] = int(number)
    header = next((i for i, text in enumerate(texts) if DURATIONS_HEADER.search(text)), None)
    slowest = []
    for text in texts[header + 1:] if header is not None else []:
        match = DURATION.match(text)
        if match is None:
            break
        slowest.append({"s": float(match["seconds"]), "phase": match["phase"], "test": match["test"]})
    return {"setup_s": next((stamp for stamp, text in lines if text.strip() == SETUP_DONE), None), **found,
            "pytest_s": float(summary["seconds"]) if summary else None, "outcome": outcome, "slowest": slowest}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slowest", type=int, default=5, help="how many of the slowest tests to record (default 5)")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the repository to clone (default: this checkout)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--gemm-seconds", type=float, default=2.0, help="length of each machine-speed measurement")
    parser.add_argument("--keep", action="store_true", help="keep the clone and its timed log (printed)")
    args = parser.parse_args(argv)
    if args.slowest < 1:
        parser.error("--slowest must be positive")
    from command1_costs import gemm_gflops

    repo = args.repo.resolve()
    commit, uncommitted = git(repo, "rev-parse", "HEAD"), len(git(repo, "status", "--porcelain").splitlines())
    scratch = Path(tempfile.mkdtemp(prefix="ci-walltime-"))  # the clone and its venv: about 6 GB
    clone, log = scratch / "clone", scratch / "ci.log"
    try:
        git(repo, "clone", "--quiet", str(repo), str(clone))
        env = {**os.environ,
               "PYTEST_ADDOPTS": f"{os.environ.get('PYTEST_ADDOPTS', '')} --durations={args.slowest}".strip()}
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        speed_before, load_before = gemm_gflops(args.gemm_seconds), os.getloadavg()[0]
        status, lines, wall = run_timed([CI_COMMAND], clone, env, log)
        speed_after, load_after = gemm_gflops(args.gemm_seconds), os.getloadavg()[0]
    finally:
        if args.keep:
            print(f"kept the clone and its timed log in {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    record = {"benchmark": "ci_walltime", "date": started, "commit": commit, "uncommitted_files": uncommitted,
              "cpus": os.cpu_count(), "command": CI_COMMAND, "exit_status": status, "wall_s": wall, **phases(lines),
              "gemm_gflops_1thread": {"before": speed_before, "after": speed_after},
              "loadavg_1min": {"before": load_before, "after": load_after}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    print(json.dumps(record, indent=1))
    if status != 0:
        print(f"{CI_COMMAND} failed ({status}); the end of its output:", *(text for _, text in lines[-40:]),
              sep="\n", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
