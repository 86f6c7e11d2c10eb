"""Where a claim's numbers come from: this profile's built results (`ReproducedSource`) or the paper's own
printed numbers (`PaperSource`). Both answer the same questions (a source's interface, also met by
hnclip.claims.calibration's simulated reproductions):

  has(table, row, part)              whether the row has that (benchmark, direction, metric) cell
  cell(table, row, part, selection)  its draws (estimate, then bootstrap replicates) at an epoch selection
  epochs(table, row, part)           the epochs evaluated
  probe(figure, method)              the figure's gradient-probe records
  resample(unit, values, statistic)  draws of a statistic of per-record values
  caption_geometry(benchmark, field) a caption-statistics value
  timing(table, row, metric)         a timing table's value
  no_interval(statistic)             why a statistic's value has no interval
  evidence                           (file, item) of every number read
"""
from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Callable

import numpy as np

from hnclip.claims.definitions import statistic_kinds
from hnclip.config import paths
from hnclip.config.registry import Registry
from hnclip.evaluation.bootstrap import Bootstrap
from hnclip.io import read_json, read_jsonl
from hnclip.report.effects import CellUnavailable, Column, PaperCells, ReproducedCells

# results/stats fields -> Table A1's metrics (the paper's side of the caption-geometry claims)
PAPER_GEOMETRY = {"mean_hardest_negative_cosine": "hardest_sim", "mean_pairwise_cosine": "pairwise_sim"}


class ReproducedSource:
    """This profile's built tables, evaluation, statistics and gradient-probe records. Every number
    read is noted in `evidence` as (file, item)."""

    def __init__(self, reg: Registry, boot: Bootstrap, seed_sd: float = 0.0):
        self.reg, self.boot, self.seed_sd = reg, boot, seed_sd
        self.cells = ReproducedCells(boot)
        self.evidence: list[tuple[str, str]] = []

    def _table(self, table: str):
        if table not in self.reg.params["tables"]:  # a stale file of another profile is no evidence
            raise CellUnavailable("not built by this profile", table)
        return self.cells.table(table)

    def has(self, table: str, row: str, part: tuple[str, str, str]) -> bool:
        return self._table(table).has(row, part)

    def cell(self, table: str, row: str, part: tuple[str, str, str], selection) -> np.ndarray:
        cells = self._table(table)
        draws = cells.draws(row, part, selection)
        self.evidence += cells.reference(row, part, selection)
        if self.seed_sd > 0 and len(draws) > 1 and len(cells.seeds(row, part)) == 1:
            # one seed: its replicates carry the between-seed term too (several seeds are resampled instead)
            # one term per run, shared by all its cells (a second seed moves the whole model)
            run = ",".join(sorted({str(Path(f).parent) for f in cells.eval_files(row, part)}))
            draws = np.concatenate([draws[:1], draws[1:] + self.boot.seed_jitter(run, self.seed_sd)])
        return draws

    def epochs(self, table: str, row: str, part: tuple[str, str, str]) -> list[int]:
        return self._table(table).epochs(row, part)

    def probe(self, figure: str, method: str | None) -> list[dict]:
        """The figure's runs' probe records, each with its `run`."""
        spec = self.reg.params["figures"].get(figure)
        if spec is None:
            raise CellUnavailable("not drawn by this profile", figure)
        runs = sorted({c.run_id for c in self.reg.figure_cells(spec) if method in (None, c.method)})
        records = []
        for run_id in runs:
            path = paths.run_dir(run_id) / "grad_probe.jsonl"
            if path.is_file():
                records += [{**r, "run": run_id} for r in read_jsonl(path)]
                self.evidence.append((str(path), ""))
        if not records:
            raise CellUnavailable("no gradient-probe records of its runs (execution.grad_probe_every is 0, "
                                  "or its runs are not implemented yet)", figure)
        return records

    def resample(self, unit: str, values: np.ndarray, statistic: Callable) -> np.ndarray:
        """Draws of statistic(values) with the items resampled (one generator per unit)."""
        index = self.boot.resample(unit, len(values))
        return np.concatenate([[statistic(values[None, :])[0]], statistic(values[index])])

    def caption_geometry(self, benchmark: str, field: str) -> np.ndarray:
        path = paths.stats(benchmark)
        if benchmark not in self.reg.params["benchmarks"] or not path.is_file():
            raise CellUnavailable("no caption statistics in this profile", benchmark)
        self.evidence.append((str(path), field))
        return np.array([float(read_json(path)[field])])

    @staticmethod
    def no_interval(statistic: dict) -> str:
        return no_interval_reason(statistic)

    def step_times(self, table: str, row: str) -> np.ndarray:
        """A row's optimizer-step seconds per round of the paired timing (hnclip.commands.step_timing)."""
        path = paths.step_timing()
        if table not in self.reg.params.get("derived_tables", {}) or not path.is_file():
            raise CellUnavailable("no paired step timing in this profile (results/stats/step_timing.json)", table)
        record = read_json(path)
        if record.get("table") != table or row not in record.get("seconds", {}):
            raise CellUnavailable("not timed by the paired step timing", f"{table} {row}")
        self.evidence.append((str(path), f"seconds/{row}"))
        return np.asarray(record["seconds"][row], dtype=float)


def no_interval_reason(statistic: dict) -> str:
    """Why a statistic's value has no interval (the first reason among the kinds it uses)."""
    kinds = statistic_kinds(statistic)
    if "caption_geometry" in kinds:
        return "the caption statistics keep no per-caption values"
    if "probe:first_step_below" in kinds:
        return "a first crossing has no sampling interval"
    if "probe:max_log10_ratio" in kinds:
        return "a maximum over the probes has no bootstrap interval"
    return "an evaluation record it reads holds no per-query ranks (evaluated before they were kept: rerun it)"


class PaperSource:
    """The paper's printed tables (best epoch only; no probe records): the claims on its own numbers."""

    def __init__(self):
        self.evidence: list[tuple[str, str]] = []

    @staticmethod
    def _table(table: str) -> PaperCells:
        return paper_cells(table)

    def has(self, table: str, row: str, part: tuple[str, str, str]) -> bool:
        return not math.isnan(self._table(table).value(row, Column(*part, parts=(part,))))

    def cell(self, table: str, row: str, part: tuple[str, str, str], selection) -> np.ndarray:
        if selection not in (None, "best"):
            raise CellUnavailable(f"the paper prints no {selection!r}-epoch values", f"{table} {row}")
        return np.array([self._table(table).value(row, Column(*part, parts=(part,)))])

    def epochs(self, table: str, row: str, part: tuple[str, str, str]) -> list[int]:
        raise CellUnavailable("the paper prints no per-epoch values (Figs. 5, A9 are curves)", f"{table} {row}")

    def probe(self, figure: str, method: str | None) -> list[dict]:
        raise CellUnavailable("the paper publishes no gradient-probe records", figure)

    @staticmethod
    def no_interval(statistic: dict) -> str:
        return "the paper's printed numbers"

    @staticmethod
    def step_times(table: str, row: str) -> np.ndarray:
        raise CellUnavailable("the paper publishes no paired step timings", f"{table} {row}")

    def caption_geometry(self, benchmark: str, field: str) -> np.ndarray:
        if field not in PAPER_GEOMETRY:
            raise CellUnavailable("Table A1 prints no such statistic", field)
        return np.array([paper_geometry(benchmark, field)])



@functools.lru_cache(maxsize=None)
def paper_cells(table: str) -> PaperCells:
    """A paper table's printed cells (read once)."""
    from hnclip.report.paper_reference import table_names
    if table not in table_names():  # e.g. Table X1: a control beyond the paper
        raise CellUnavailable("the paper prints no values of this table", table)
    return PaperCells(table)


@functools.lru_cache(maxsize=None)
def paper_geometry(benchmark: str, field: str) -> float:
    """Table A1's value of a caption-statistics field (the paper's side of the geometry claims)."""
    return paper_cells("tableA1").value(benchmark, Column(benchmark, "none", PAPER_GEOMETRY[field], ()))

