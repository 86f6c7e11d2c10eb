"""Process start-up: seconds for `import MODULE` in a fresh interpreter, with and without compiled modules.

    python benchmarks/import_times.py                        # the modules every job or tool starts with
    python benchmarks/import_times.py --modules json --repeats 1 --out /tmp/x.jsonl     # a smoke run

Every job of the workflow, every Snakemake and DVC invocation and every warm server is a new Python
process. `./setup.sh` byte-compiles the venv once, because where PYTHONDONTWRITEBYTECODE is set (as in
many containers) Python never caches what it compiles, and a venv installed without compiled modules
is compiled from source again by every process. For each module this measures, in its own interpreter:

* `compiled`: the venv as setup.sh leaves it (its `__pycache__` files are read);
* `from_source`: PYTHONDONTWRITEBYTECODE=1 and an empty PYTHONPYCACHEPREFIX, so that no compiled file
  is found or written: every module is compiled from source, as in such a container without the step;
* `project_from_source` (the project's own modules only): the venv compiled, the project's package
  compiled from source (a copy of src/ without bytecode first on PYTHONPATH, nothing written), as
  when setup.sh had not compiled src/.

The median of --repeats wall-clock seconds per condition (interpreter start included), conditions
interleaved; one JSON line appended to benchmarks/results/import_times.jsonl, with the machine's
single-thread GEMM speed (`command1_costs.gemm_gflops`).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark scripts
from command1_costs import append_record, gemm_gflops, utc_now  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "import_times.jsonl"
# What the processes of command 1 and of the test suite start with: the model library, the workflow and
# DVC command lines, plotting, and the project's own command line (which imports the rest lazily).
MODULES = ("open_clip", "torch", "snakemake.cli", "dvc.cli", "matplotlib.pyplot", "hnclip.cli",
           "hnclip.commands.train")
CONDITIONS = ("compiled", "from_source", "project_from_source")
PROJECT_PACKAGE = "hnclip"


def conditions_of(module: str) -> tuple[str, ...]:
    return CONDITIONS if module.split(".")[0] == PROJECT_PACKAGE else CONDITIONS[:2]


def condition_env(condition: str, empty_prefix: Path, source_copy: Path | None = None) -> dict:
    """`source_copy`: a directory holding a bytecode-free copy of the project's package
    (`project_from_source`)."""
    env = dict(os.environ)
    env.pop("PYTHONPYCACHEPREFIX", None)
    if condition == "from_source":
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONPYCACHEPREFIX"] = str(empty_prefix)  # nothing compiled is found there, nothing is written
    if condition == "project_from_source":
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source_copy), env.get("PYTHONPATH")]))
    return env


def import_seconds(module: str, env: dict) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", f"import {module}"], env=env, cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"import {module} failed:\n{done.stderr[-2000:]}")
    return elapsed


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", default=",".join(MODULES), help="comma-separated modules to import")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    modules = [m.strip() for m in args.modules.split(",") if m.strip()]
    if args.repeats < 1 or not modules:
        parser.error("--repeats must be positive and --modules name at least one module")
    from hnclip.provenance import git_state, library_versions
    started = utc_now()
    speed_before = gemm_gflops()
    seconds: dict[str, dict[str, list[float]]] = {m: {c: [] for c in conditions_of(m)} for m in modules}
    with tempfile.TemporaryDirectory(prefix="empty-pycache-") as empty, \
            tempfile.TemporaryDirectory(prefix="project-source-") as source_copy:
        shutil.copytree(ROOT / "src" / PROJECT_PACKAGE, Path(source_copy) / PROJECT_PACKAGE,
                        ignore=shutil.ignore_patterns("__pycache__"))
        for _ in range(args.repeats):
            for module in modules:
                for condition in conditions_of(module):
                    env = condition_env(condition, Path(empty), Path(source_copy))
                    seconds[module][condition].append(import_seconds(module, env))
        left_empty = not any(Path(empty).iterdir()) and not list(Path(source_copy).rglob("__pycache__"))
    median = {m: {c: round(statistics.median(s), 3) for c, s in by.items()} for m, by in seconds.items()}
    record = {"benchmark": "import_times", "timestamp": started, "git": git_state(ROOT),
              "libraries": library_versions(), "python": sys.version.split()[0], "cpus": os.cpu_count(),
              "load_average_1min": os.getloadavg()[0], "repeats": args.repeats,
              "gemm_gflops_1thread": {"before": speed_before, "after": gemm_gflops()},
              "from_source_wrote_nothing": left_empty, "median_s": median,
              "from_source_extra_s": {m: round(v["from_source"] - v["compiled"], 3) for m, v in median.items()},
              "project_from_source_extra_s": {m: round(v["project_from_source"] - v["compiled"], 3)
                                              for m, v in median.items() if "project_from_source" in v},
              "seconds": seconds}
    return append_record(args.out, record)


if __name__ == "__main__":
    main()
