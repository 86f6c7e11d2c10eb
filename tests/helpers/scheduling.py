"""How the suite is spread over xdist workers (`--dist loadfile`: one module per work unit).

Two things beyond xdist's default:
- the longest modules are collected first, so each starts at once on a free worker and the short ones
  fill the gaps (LONGEST_FIRST, applied by conftest.py);
- modules that take an expensive session fixture (a micro project built in about a minute) form one
  work unit, so one worker builds it once instead of every worker that draws one of them building its
  own. Which modules take it is read from their test functions' parameters, not from a list to keep.
"""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SHARED_SESSION_FIXTURES = ("micro_project",)

# The longest modules, longest first (wall time on two busy cores: end-to-end workflows, the SLURM
# cluster, the micro project's modules, benchmark children, killed and resumed runs, two-process runs).
# They are collected first and xdist keeps that order (its default sorts modules by their number of
# tests), so each starts on a free worker at once and the short modules fill the gaps at the end,
# instead of a long module starting late and ending the run alone.
LONGEST_FIRST = ("test_paper_rehearsal.py", "test_slurm.py", "test_workflow.py", "test_lineage_audit.py",
                 "test_benchmarks.py", "test_baseline_training.py", "test_margin_controls.py",
                 "test_transfer_selection.py", "test_train.py", "test_compute_batch.py", "test_train_extensions.py",
                 "test_ddp.py", "test_claims.py", "test_registry.py")


def modules_taking(fixture: str, tests: Path = TESTS) -> set[str]:
    """The test modules (file names) with a test function or fixture that takes `fixture` as a parameter."""
    found = set()
    for module in sorted(tests.glob("test_*.py")):
        tree = ast.parse(module.read_text(), filename=str(module))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    fixture in {arg.arg for arg in node.args.args}:
                found.add(module.name)
                break
    return found


def work_unit_of_module(tests: Path = TESTS) -> dict[str, str]:
    """Module file name -> the shared fixture whose work unit it joins (modules taking none are absent)."""
    return {module: fixture for fixture in SHARED_SESSION_FIXTURES for module in modules_taking(fixture, tests)}


def grouped_file_scheduling(config, log, tests: Path = TESTS):
    """xdist's LoadFileScheduling, with the modules of a shared session fixture as one work unit."""
    from xdist.scheduler import LoadFileScheduling
    groups = work_unit_of_module(tests)

    class GroupedFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            fixture = groups.get(Path(module).name)
            return f"shared-fixture:{fixture}" if fixture else module

    return GroupedFileScheduling(config, log)
