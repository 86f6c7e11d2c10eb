"""`hnclip cell`: one table cell -> its Snakemake target(s), built alone."""
from __future__ import annotations

import subprocess
import sys

from hnclip.config import paths
from hnclip.config.registry import Cell, Registry
from hnclip.errors import UnknownNameError


class CellError(UnknownNameError):
    """No cell of a table matches the requested benchmark and settings."""


def _matches(cell: Cell, key: str, value: str) -> bool:
    if key == "seed":
        return cell.seed == int(value)
    if key == "row":
        return cell.row == value
    settings = dict(cell.settings)
    if key not in settings:
        raise CellError(f"unknown setting {key!r}; use row, seed or one of {sorted(settings)}")
    current = settings[key]
    try:
        return float(current) == float(value)
    except (TypeError, ValueError):
        return str(current) == value


def resolve(reg: Registry, table: str, benchmark: str | None = None,
            settings: dict[str, str] | None = None) -> list[Cell]:
    """The cells of `table` matching a benchmark and `key=value` settings (row, seed, gamma, ...)."""
    cells = reg.cells(table)
    if benchmark:
        if benchmark not in {c.benchmark for c in cells}:
            raise CellError(f"{table} has no benchmark {benchmark!r}; allowed values: "
                            f"{sorted({c.benchmark for c in cells})}")
        cells = [c for c in cells if c.benchmark == benchmark]
    for key, value in (settings or {}).items():
        cells = [c for c in cells if _matches(c, key, value)]
    if not cells:
        rows = sorted({c.row for c in reg.cells(table)})
        raise CellError(f"no cell of {table} matches {settings}; its rows are {rows} "
                        f"(to add a new setting, add it to params.yaml's tables.{table})")
    return cells


def targets(cells: list[Cell]) -> list[str]:
    return sorted({str(paths.evaluation(c.run_id, c.benchmark)) for c in cells if c.run_id})


WORKFLOW_PROFILE = "workflow/profiles/default"  # the rerun triggers command 1 uses (params and inputs)


def snakemake_command(reg: Registry, target_files: list[str], cores: str = "all") -> list[str]:
    return [sys.executable, "-m", "snakemake", *target_files, "--workflow-profile", WORKFLOW_PROFILE,
            "--cores", cores, "--config", f"profile={reg.profile_name}"]


def run(reg: Registry, cells: list[Cell], dry_run: bool = False) -> int:
    files = targets(cells)
    skipped = sorted({(c.table, c.row, c.benchmark, c.status) for c in cells if not c.run_id})
    for table, row, benchmark, status in skipped:
        print(f"{table} {row} / {benchmark}: {status}")
    if not files:
        return 1 if skipped else 0
    command = snakemake_command(reg, files) + (["-n"] if dry_run else [])
    print("$ snakemake " + " ".join(command[3:]))
    code = subprocess.run(command).returncode
    for cell in cells:
        if cell.run_id:
            print(f"{cell.table} {cell.row} / {cell.benchmark} / seed {cell.seed}: "
                  f"{paths.evaluation(cell.run_id, cell.benchmark)}")
    return code
