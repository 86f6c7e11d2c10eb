"""The claims scorecard: every quantitative claim of the paper (claims.yaml) judged on this profile's
results, with its 95 % interval, as results/claims.csv and results/claims.md.

A claim's statistic is computed from "items" (one value per cell, contrast, benchmark, epoch or run,
each as draws: estimate then bootstrap replicates, see hnclip.report.effects) reduced to one number; its
decision (e.g. "count >= 8", "> 0", "between -1 and 1") gives the verdict:
  supported       the whole 95 % interval satisfies the decision (without an interval: the estimate)
  contradicted    none of the interval does
  inconclusive    the interval straddles the decision
  not_testable    the profile cannot test it (the reason says why: a magnitude of the real benchmarks
                  on the miniature, a regime precondition that fails on this profile with its measured
                  value, a table or figure this profile does not build)
  not_implemented a cell it needs belongs to a row this pipeline does not train yet
Counts of "all N" claims take a tie tolerance stated per claim: an item within it of the decision
counts, because an exact reproduction at the paper's test-set sizes cannot resolve less
(hnclip.report.calibration checks every rule against simulated exact reproductions).

The same statistics run on the paper's own printed numbers (`PaperSource`; where the paper prints no
table for it, the number its text states): the scorecard's `paper_verdict` column, and
`paper_self_consistent` where the paper's own numbers contradict its claim.
"""
from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from hnclip import provenance
from hnclip.config import paths
from hnclip.config.registry import NOT_IMPLEMENTED, Registry
from hnclip.io import read_json, read_jsonl, write_json, write_text
from hnclip.report.effects import (
    CellUnavailable,
    Column,
    PaperCells,
    ReproducedCells,
    aligned,
    definitions,
    format_evidence,
    summarise,
)
from hnclip.report.uncertainty import Bootstrap, BootstrapSettings

VERDICTS = ("supported", "contradicted", "inconclusive", "not_testable", "not_implemented")
CLAIMS_CSV = paths.RESULTS / "claims.csv"
CLAIMS_MD = paths.RESULTS / "claims.md"
CLAIMS_PROVENANCE = paths.RESULTS / "claims.provenance.json"
COLUMNS = ["claim_id", "quote", "paper_value", "reproduced_value", "ci_low", "ci_high", "verdict", "evidence",
           "decision", "reason", "where", "paper_verdict", "paper_number", "paper_self_consistent", "tolerance",
           "sanity_check", "requires"]
# results/stats fields -> Table A1's metrics (the paper's side of the caption-geometry claims)
PAPER_GEOMETRY = {"mean_hardest_negative_cosine": "hardest_sim", "mean_pairwise_cosine": "pairwise_sim"}


def claims() -> list[dict]:
    return definitions()["claims"]


# ---- where the numbers come from ------------------------------------------------------------------
class ReproducedSource:
    """This profile's built tables, evaluation, statistics and gradient-probe records. Every number
    read is noted in `evidence` as (file, item)."""

    def __init__(self, reg: Registry, boot: Bootstrap):
        self.reg, self.boot = reg, boot
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

    def timing(self, table: str, row: str, metric: str) -> float:
        path = paths.table(table, "csv")
        if table not in self.reg.params.get("derived_tables", {}) or not path.is_file():
            raise CellUnavailable("not built by this profile", table)
        frame = pd.read_csv(path)
        hit = frame[(frame["row"] == row) & (frame["metric"] == metric)]
        if hit.empty:
            raise CellUnavailable("no such row and metric", f"{table} {row}/{metric}")
        if hit.iloc[0]["status"] != "ok":
            raise CellUnavailable(hit.iloc[0]["status"], f"{table} {row}")
        self.evidence.append((str(path), f"{row}/{metric}"))
        return float(hit.iloc[0]["ours"])


def no_interval_reason(statistic: dict) -> str:
    """Why a statistic's value has no interval (the first reason among the kinds it uses)."""
    kinds = _kinds(statistic)
    if "timing_ratio" in kinds:
        return "one timed run per method"
    if "caption_geometry" in kinds:
        return "the caption statistics keep no per-caption values"
    if "probe:first_step_below" in kinds:
        return "a first crossing has no sampling interval"
    if "probe:max_log10_ratio" in kinds:
        return "a maximum over the probes has no bootstrap interval"
    return "an evaluation record it reads holds no per-query ranks (evaluated before they were kept: rerun it)"


def _kinds(statistic: dict) -> set[str]:
    out = set()
    for key, value in statistic.items():
        if key in ("difference", "concat"):
            out |= set().union(*(_kinds(s) for s in value))
        elif isinstance(value, dict):
            out.add(key)
            if key == "probe":
                out.add(f"probe:{value['measure']}")
    return out


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

    def caption_geometry(self, benchmark: str, field: str) -> np.ndarray:
        if field not in PAPER_GEOMETRY:
            raise CellUnavailable("Table A1 prints no such statistic", field)
        return np.array([paper_geometry(benchmark, field)])

    def timing(self, table: str, row: str, metric: str) -> float:
        benchmark = self._table(table).benchmark_of(row)
        return self._table(table).value(row, Column(benchmark, "none", metric, ()))


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


# ---- statistics -----------------------------------------------------------------------------------
def columns(spec: dict) -> list[Column]:
    """A claim's `columns`: plain cells, each benchmark's mean over both directions, or one pooled column."""
    benchmarks, directions, metrics = spec["benchmarks"], spec["directions"], spec["metrics"]
    if spec.get("pool"):
        parts = tuple(itertools.product(benchmarks, directions, metrics))
        return [Column("pooled", "both", "mean", parts)]
    if directions == "mean":
        return [Column(b, "both", m, ((b, "t2i", m), (b, "i2t", m))) for b in benchmarks for m in metrics]
    return [Column(b, d, m, ((b, d, m),)) for b in benchmarks for d in directions for m in metrics]


def _column_draws(source, table: str, row: str, column: Column, selection, missing: set) -> np.ndarray | None:
    if len(column.parts) == 1:
        try:
            return source.cell(table, row, column.parts[0], selection)
        except CellUnavailable as exc:
            if exc.status != NOT_IMPLEMENTED:
                raise
            missing.add(f"{table} {row}")
            return None
    parts = []
    for part in column.parts:
        try:
            parts.append(source.cell(table, row, part, selection))
        except CellUnavailable as exc:
            if exc.status != NOT_IMPLEMENTED:
                raise
            missing.add(f"{table} {row}")
    if len(parts) != len(column.parts):
        return None
    return parts[0] if len(parts) == 1 else np.mean(np.stack(aligned(*parts)), axis=0)


def row_of(entry: str, table: str) -> tuple[str, str]:
    """`row@table` names a row of another table (e.g. plain fine-tuning from Table A4 as a companion
    claim's competitor); a plain row is one of `table`."""
    row, _, other = entry.partition("@")
    return row, other or table


def _common_epochs(source, rows: list[tuple[str, str]], column: Column) -> list[int]:
    held = [set(source.epochs(table, row, part)) for row, table in rows for part in column.parts]
    return sorted(set.intersection(*held)) if held else []


def _contrast(spec: dict, source) -> list[np.ndarray]:
    """a − b (or − the best, or the `b_rank`-th best, of several b) for each pair and column the a row
    has; with `epochs: each`, one item per epoch both sides evaluated."""
    table, b_table = spec["table"], spec.get("b_table", spec["table"])
    a_selection = spec.get("a_selection", spec.get("selection"))
    b_selection = spec.get("b_selection", spec.get("selection"))
    rank = spec.get("b_rank", 1)
    items, missing = [], set()
    for a, b in spec["pairs"]:
        others = [row_of(row, b_table) for row in ([b] if isinstance(b, str) else b)]
        if rank > len(others):
            raise ValueError(f"b_rank {rank} of {len(others)} rows")
        for column in columns(spec["columns"]):
            if not all(source.has(table, a, part) for part in column.parts):
                continue  # e.g. Table A9's rows each have one benchmark
            if spec.get("epochs") == "each":
                selections = [(e, e) for e in _common_epochs(source, [(a, table), *others], column)]
                if not selections:
                    raise CellUnavailable("no epoch evaluated for every row", f"{table} {a}")
            else:
                selections = [(a_selection, b_selection)]
            for sel_a, sel_b in selections:
                a_draws = _column_draws(source, table, a, column, sel_a, missing)
                b_draws = [_column_draws(source, t, row, column, sel_b, missing) for row, t in others]
                if a_draws is not None and all(d is not None for d in b_draws):
                    arrays = aligned(a_draws, *b_draws)
                    if len(arrays) == 2:
                        items.append(arrays[0] - arrays[1])
                        continue
                    stacked = np.stack(arrays[1:])
                    best = stacked.max(axis=0) if rank == 1 else np.sort(stacked, axis=0)[-rank]
                    items.append(arrays[0] - best)
    if missing:
        raise CellUnavailable(NOT_IMPLEMENTED, ", ".join(sorted(missing)))
    if not items:
        raise CellUnavailable("none of the cells this claim compares", table)
    return items


def _spread(spec: dict, source) -> list[np.ndarray]:
    """Per column, the largest minus the smallest value over the rows."""
    items, missing = [], set()
    for column in columns(spec["columns"]):
        draws = [_column_draws(source, spec["table"], row, column, spec.get("selection"), missing)
                 for row in spec["rows"]]
        if all(d is not None for d in draws):
            stacked = np.stack(aligned(*draws))
            items.append(stacked.max(axis=0) - stacked.min(axis=0))
    if missing:
        raise CellUnavailable(NOT_IMPLEMENTED, ", ".join(sorted(missing)))
    return items


TRAJECTORY_MEASURES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    # x: [epochs, draws], epochs in order
    "max_drawdown": lambda x: (np.maximum.accumulate(x, axis=0) - x).max(axis=0),  # largest fall below a peak
    "peak_first": lambda x: x[0] - x[1:].max(axis=0),  # epoch 1 minus the best later epoch
    "first_minus_last": lambda x: x[0] - x[-1],
    "last_minus_first": lambda x: x[-1] - x[0],
}


def _trajectory(spec: dict, source) -> list[np.ndarray]:
    """Per row and column, a measure of the row's values over every evaluated epoch."""
    table, measure = spec["table"], TRAJECTORY_MEASURES[spec["measure"]]
    items, missing = [], set()
    for row in spec["rows"]:
        for column in columns(spec["columns"]):
            epochs = _common_epochs(source, [(row, table)], column)
            if len(epochs) < 2:
                raise CellUnavailable("fewer than two evaluated epochs", f"{table} {row}")
            draws = [_column_draws(source, table, row, column, e, missing) for e in epochs]
            if all(d is not None for d in draws):
                items.append(measure(np.stack(aligned(*draws))))
    if missing:
        raise CellUnavailable(NOT_IMPLEMENTED, ", ".join(sorted(missing)))
    return items


def _order_preserved(spec: dict, source) -> list[np.ndarray]:
    """For each pair of rows and column, the smaller of the two signed differences (reference rows and
    their replicate rows, e.g. two seeds), signed by the reference estimate's order: negative where the
    replicate swaps the pair."""
    table, reference, replicate = spec["table"], spec["reference"], spec["replicate"]
    if len(reference) != len(replicate):
        raise ValueError("order_preserved: reference and replicate name the same number of rows")
    items, missing = [], set()
    for column in columns(spec["columns"]):
        draws = [_column_draws(source, table, row, column, spec.get("selection"), missing)
                 for row in [*reference, *replicate]]
        if any(d is None for d in draws):
            continue
        arrays = aligned(*draws)
        ref, rep = arrays[:len(reference)], arrays[len(reference):]
        blocks = getattr(source, "sims", 1)  # several simulated reproductions' draws one after another
        for i, j in itertools.combinations(range(len(reference)), 2):
            estimates = (ref[i] - ref[j]).reshape(blocks, -1)[:, :1]  # each block's estimate sets its order
            sign = np.broadcast_to(np.where(estimates >= 0, 1.0, -1.0), (blocks, len(ref[i]) // blocks)).ravel()
            items.append(np.minimum(sign * (ref[i] - ref[j]), sign * (rep[i] - rep[j])))
    if missing:
        raise CellUnavailable(NOT_IMPLEMENTED, ", ".join(sorted(missing)))
    return items


def _share(mask: np.ndarray) -> np.ndarray:
    return mask.mean(axis=-1)


def _ratios(records: list[dict], field: str, over: str) -> np.ndarray:
    return np.array([r[field] / r[over] for r in records if r[over] > 0])


def _probe_values(measure: str, spec: dict, records: list[dict]) -> tuple[np.ndarray, Callable]:
    """(per-record values, statistic of a [.., n] array of them) of one probe measure."""
    field = spec["field"]
    if measure in ("share_below", "share_at_least"):
        below = np.array([r[field] < spec["threshold"] for r in records], dtype=bool)
        return (below if measure == "share_below" else ~below).astype(float), _share
    if measure in ("share_true", "share_false"):
        return np.array([bool(r[field]) == (measure == "share_true") for r in records], dtype=float), _share
    if measure == "median_ratio":
        return _ratios(records, field, spec["over"]), lambda v: np.median(v, axis=-1)
    values = np.array([r[field] for r in records if r[field] is not None], dtype=float)
    reducers = {"mean": lambda v: v.mean(axis=-1), "median": lambda v: np.median(v, axis=-1),
                "share_positive": lambda v: _share(v > 0)}
    return values, reducers[measure]


PER_EPOCH = {"min_epoch_share_at_least": ("share_at_least", "min"), "min_epoch_median_ratio": ("median_ratio", "min")}


def _probe_item(spec: dict, records: list[dict], unit: str, source) -> np.ndarray:
    """One item of a probe statistic over `records` (one run's, or all the figure's runs')."""
    measure = spec["measure"]
    if measure == "first_step_below":  # the first optimizer step whose probe falls below the threshold
        below = [r["step"] for r in sorted(records, key=lambda r: r["step"]) if r[spec["field"]] < spec["threshold"]]
        return np.array([float(below[0]) if below else math.inf])
    if measure == "max_log10_ratio":
        ratios = _ratios(records, spec["field"], spec["over"])
        if not len(ratios):
            raise CellUnavailable("no probe where the ratio's denominator is nonzero", unit)
        return np.array([math.log10(ratios.max())])
    if measure in PER_EPOCH:  # every epoch resampled within itself (stratified), then the smallest
        base, _ = PER_EPOCH[measure]
        per_epoch = []
        for epoch in sorted({r["epoch"] for r in records}):
            in_epoch = [r for r in records if r["epoch"] == epoch]
            if base == "share_at_least":
                values = np.array([r[spec["field"]] >= spec["threshold"] for r in in_epoch], dtype=float)
                statistic = _share
            else:
                values, statistic = _probe_values("median_ratio", spec, in_epoch)
            if len(values):
                per_epoch.append(source.resample(f"{unit}:epoch{epoch}", values, statistic))
        if not per_epoch:
            raise CellUnavailable("no probe records to measure", unit)
        return np.min(np.stack(aligned(*per_epoch)), axis=0)
    values, statistic = _probe_values(measure, spec, records)
    if not len(values):
        raise CellUnavailable(f"no probe records with a value for {spec['measure']}", unit)
    return source.resample(unit, values, statistic)


def _probe(spec: dict, source) -> list[np.ndarray]:
    """Probe statistics: pooled over the figure's runs, or one item per run (`per_run`)."""
    records = source.probe(spec["figure"], spec.get("method"))
    unit = f"probe:{spec['figure']}:{spec.get('method')}"
    if "epoch" in spec:
        records = [r for r in records if r["epoch"] == spec["epoch"]]
    if "from_epoch_fraction" in spec:  # the epochs after this fraction of training, e.g. 0.5: 6-10 of 10
        last = max(r["epoch"] for r in records)
        records = [r for r in records if r["epoch"] > spec["from_epoch_fraction"] * last]
    if not records:
        raise CellUnavailable("no probe records in the epochs it measures", spec["figure"])
    if not spec.get("per_run"):
        return [_probe_item(spec, records, unit, source)]
    runs = sorted({r.get("run") for r in records})
    return [_probe_item(spec, [r for r in records if r.get("run") == run], f"{unit}:{run}", source) for run in runs]


def _caption_geometry(spec: dict, source) -> list[np.ndarray]:
    """Each benchmark's field (`versus_paper`: minus Table A1's value of it)."""
    values = [source.caption_geometry(b, spec["field"]) for b in spec["benchmarks"]]
    if spec.get("versus_paper"):
        return [v - paper_geometry(b, spec["field"]) for v, b in zip(values, spec["benchmarks"])]
    return values


def _timing_ratio(spec: dict, source) -> list[np.ndarray]:
    numerator = source.timing(spec["table"], spec["numerator"], spec["metric"])
    return [np.array([numerator / source.timing(spec["table"], spec["denominator"], spec["metric"])])]


# Reducers of a [items, draws] stack; `tol` is the statistic's tie tolerance: an item within it of 0
# counts for count_positive / count_nonnegative (a tie an exact reproduction cannot resolve).
REDUCERS: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "min": lambda x, tol: x.min(axis=0), "max": lambda x, tol: x.max(axis=0), "mean": lambda x, tol: x.mean(axis=0),
    "abs_mean": lambda x, tol: np.abs(x).mean(axis=0), "max_abs": lambda x, tol: np.abs(x).max(axis=0),
    "count_positive": lambda x, tol: (x > -tol).sum(axis=0).astype(float),
    "count_nonnegative": lambda x, tol: (x >= -tol).sum(axis=0).astype(float),
}
KINDS = {"contrast": _contrast, "spread": _spread, "probe": _probe, "caption_geometry": _caption_geometry,
         "timing_ratio": _timing_ratio, "trajectory": _trajectory, "order_preserved": _order_preserved}


def items(statistic: dict, source) -> list[np.ndarray]:
    """A statistic's items (reduced to one when it names a `reduce`)."""
    if "difference" in statistic:
        first, second = (items(s, source) for s in statistic["difference"])
        if len(first) != len(second) and 1 not in (len(first), len(second)):
            raise ValueError(f"difference of {len(first)} and {len(second)} items")
        n = max(len(first), len(second))  # one item against several: the one is repeated
        first, second = (x * n if len(x) == 1 else x for x in (first, second))
        out = [np.subtract(*aligned(f, s)) for f, s in zip(first, second)]
    elif "concat" in statistic:
        out = [item for s in statistic["concat"] for item in items(s, source)]
    else:
        (kind,) = [k for k in KINDS if k in statistic]
        out = KINDS[kind](statistic[kind], source)
    reduce = statistic.get("reduce")
    if reduce is None:
        return out
    if reduce == "value":
        if len(out) != 1:
            raise ValueError(f"`reduce: value` needs one item, got {len(out)}")
        return out
    return [REDUCERS[reduce](np.stack(aligned(*out)), float(statistic.get("tolerance", 0.0)))]


def statistic_draws(statistic: dict, source) -> np.ndarray:
    out = items(statistic, source)
    if len(out) != 1:
        raise ValueError(f"a claim's statistic must reduce to one value, got {len(out)} items (add `reduce`)")
    return out[0]


# ---- verdicts ------------------------------------------------------------------------------------
def decision_text(decision: dict, tolerance: float | None = None) -> str:
    text = (f"between {decision['low']:g} and {decision['high']:g}" if decision["op"] == "between"
            else f"{decision['op']} {decision['threshold']:g}")
    return text + (f" (tie tolerance {tolerance:g})" if tolerance else "")


def _holds(decision: dict, value: float) -> bool:
    op = decision["op"]
    if op == "between":
        return decision["low"] <= value <= decision["high"]
    threshold = decision["threshold"]
    return {">": value > threshold, ">=": value >= threshold, "<": value < threshold, "<=": value <= threshold}[op]


def decide(decision: dict, value: float, low: float, high: float) -> str:
    """supported / contradicted / inconclusive from the estimate's interval (or the estimate alone)."""
    if math.isnan(low):
        return "supported" if _holds(decision, value) else "contradicted"
    if decision["op"] == "between":
        if decision["low"] <= low and high <= decision["high"]:
            return "supported"
        return "contradicted" if high < decision["low"] or low > decision["high"] else "inconclusive"
    if _holds(decision, low) and _holds(decision, high):
        return "supported"
    return "contradicted" if not _holds(decision, low) and not _holds(decision, high) else "inconclusive"


@dataclass(frozen=True)
class Condition:
    """A precondition a claim may `require`: met (None: not measured on this profile) and what was
    measured against which target."""
    met: bool | None
    detail: str = ""


# What a claim's `requires` may name besides `real_data`: the regime report's preconditions behind each.
REGIME_CONDITIONS = {
    "strength": ("zeroshot_r1", "a strong zero-shot backbone"),
    "saturation": ("infonce_saturation", "InfoNCE saturating under plain fine-tuning"),
    "headroom": ("headroom", "plain fine-tuning improving on the zero-shot backbone"),
}


def _as_condition(value) -> Condition:
    return value if isinstance(value, Condition) else Condition(None if value is None else bool(value))


def _measured(check: dict) -> str:
    value = "n/a" if check["value"] is None else f"{check['value']:.3g}"
    return f"{check['item']} {value}"


def regime_conditions(report: dict | None) -> dict[str, Condition]:
    """strength / saturation / headroom from a regime report (results/stats/regime.json); not measured
    where the report or its precondition is missing."""
    out = {}
    for name, (key, _) in REGIME_CONDITIONS.items():
        found = [p for p in (report or {}).get("preconditions", []) if p["key"] == key]
        if not found:
            out[name] = Condition(None, "no regime report (results/stats/regime.json)" if report is None
                                  else f"the regime report has no `{key}`")
            continue
        checks = found[0]["checks"]
        target = checks[0]["target"] if checks else ""
        out[name] = Condition(found[0]["met"], ", ".join(_measured(c) for c in checks) + f" (target {target})")
    return out


def profile_conditions(reg: Registry) -> dict[str, Condition]:
    """What a claim's `requires` may name: `real_data` (every dataset of the profile is the real one)
    and the regime preconditions this profile's regime report measured (REGIME_CONDITIONS)."""
    kinds = sorted({d["kind"] for d in reg.profile["datasets"].values()})
    out = {"real_data": Condition(kinds == ["real"], f"datasets: {', '.join(kinds)}")}
    report = None
    path = paths.regime_report("json")
    if reg.params.get("regime_targets") and path.is_file():
        report = read_json(path)
        if report.get("profile") != reg.profile_name:  # a stale report of another profile is no evidence
            report = None
    return {**out, **regime_conditions(report)}


def paper_conditions(targets: dict | None = None) -> dict[str, Condition]:
    """The same preconditions on the paper's own numbers: zero-shot DOCCI R@1 (Table 1), plain
    fine-tuning − zero-shot (Table A4 − Table 1), first-epoch InfoNCE saturation (Sec. 2.4: 80 %),
    against the regime targets (params.yaml `regime_targets`, or the defaults below)."""
    targets = targets or {}
    zero_min = targets.get("zeroshot_r1", {}).get("min", 40.0)
    head_min = targets.get("headroom", {}).get("min", 5.0)
    sat_min = targets.get("infonce_saturation", {}).get("min", 0.5)
    source = PaperSource()

    def r1(table: str, row: str, direction: str) -> float:
        return float(source.cell(table, row, ("docci", direction, "R@1"), "best")[0])
    zero = {d: r1("table1", "longclip_zeroshot", d) for d in ("t2i", "i2t")}
    gain = {d: r1("tableA4", "longclip_ft", d) - zero[d] for d in ("t2i", "i2t")}
    return {"real_data": Condition(True, "the paper's real benchmarks"),
            "strength": Condition(min(zero.values()) >= zero_min, f"zero-shot DOCCI R@1 {zero['t2i']:.2f} / "
                                  f"{zero['i2t']:.2f} (target >= {zero_min:g})"),
            "saturation": Condition(0.80 >= sat_min, f"80 % of first-epoch batches below 1e-3 (target >= {sat_min:g})"),
            "headroom": Condition(min(gain.values()) >= head_min, f"plain fine-tuning − zero-shot DOCCI R@1 "
                                  f"{gain['t2i']:+.2f} / {gain['i2t']:+.2f} (target >= {head_min:g})")}


def _preconditions(claim: dict, conditions: dict) -> tuple[list[str], list[str]]:
    """(reasons of the failed preconditions, names of those not measured) of a claim's `requires`."""
    failed, unmeasured = [], []
    for name, why in claim.get("requires", {}).items():
        condition = _as_condition(conditions.get(name))
        if condition.met is None:
            unmeasured.append(name)
        elif not condition.met:
            if name in REGIME_CONDITIONS:
                failed.append(f"regime precondition `{name}` ({REGIME_CONDITIONS[name][1]}) does not hold: "
                              f"{condition.detail} — {why}")
            else:
                failed.append(why)
    return failed, unmeasured


def evaluate(claim: dict, source, conditions: dict, boot: Bootstrap) -> dict:
    """One row of the scorecard (`conditions`: name -> Condition or bool, see profile_conditions)."""
    real = _as_condition(conditions.get("real_data")).met
    decision = claim.get("real_data_decision", claim["decision"]) if real else claim["decision"]
    tolerance = claim["statistic"].get("tolerance")
    row = {"claim_id": claim["claim_id"], "quote": claim["quote"], "paper_value": claim["paper_value"],
           "reproduced_value": math.nan, "ci_low": math.nan, "ci_high": math.nan, "evidence": "",
           "decision": decision_text(decision, tolerance), "reason": "", "where": claim["where"],
           "tolerance": tolerance, "sanity_check": bool(claim.get("sanity_check")),
           "requires": ", ".join(claim.get("requires", {}))}
    failed, unmeasured = _preconditions(claim, conditions)
    if failed:
        return {**row, "verdict": "not_testable", "reason": "; ".join(failed)}
    source.evidence = []
    try:
        draws = statistic_draws(claim["statistic"], source)
    except CellUnavailable as exc:
        verdict = "not_implemented" if exc.status == NOT_IMPLEMENTED else "not_testable"
        return {**row, "verdict": verdict, "reason": str(exc), "evidence": format_evidence(source.evidence)}
    value, low, high = summarise(draws, boot)
    notes = [] if not math.isnan(low) else [f"no interval: {source.no_interval(claim['statistic'])}"]
    notes += [f"precondition `{name}` not measured on this profile" for name in unmeasured]
    return {**row, "reproduced_value": value, "ci_low": low, "ci_high": high,
            "verdict": decide(decision, value, low, high), "reason": "; ".join(notes),
            "evidence": format_evidence(source.evidence)}


def paper_judgement(claim: dict, conditions: dict | None = None) -> dict:
    """The claim on the paper's own numbers: its printed tables where they feed the statistic, else the
    number its text states (`paper_number`); not_testable where the paper gives neither.
    Returns {paper_verdict, paper_statistic, paper_reason}."""
    row = evaluate(claim, PaperSource(), conditions or paper_conditions(), Bootstrap())
    if row["verdict"] in ("supported", "contradicted"):
        return {"paper_verdict": row["verdict"], "paper_statistic": row["reproduced_value"],
                "paper_reason": "its printed tables"}
    number = claim.get("paper_number")
    if number is None:
        return {"paper_verdict": "not_testable", "paper_statistic": math.nan,
                "paper_reason": f"the paper states no number for it ({row['reason']})"}
    decision = claim.get("real_data_decision", claim["decision"])
    return {"paper_verdict": decide(decision, float(number), math.nan, math.nan), "paper_statistic": float(number),
            "paper_reason": "the number its text states"}


def _self_consistent(verdict: str):
    return {"supported": True, "contradicted": False}.get(verdict)


def scorecard(reg: Registry, boot: Bootstrap) -> pd.DataFrame:
    source, conditions = ReproducedSource(reg, boot), profile_conditions(reg)
    on_paper = paper_conditions(reg.params.get("regime_targets"))
    rows = []
    for claim in claims():
        paper = paper_judgement(claim, on_paper)
        rows.append({**evaluate(claim, source, conditions, boot), "paper_verdict": paper["paper_verdict"],
                     "paper_number": paper["paper_statistic"],
                     "paper_self_consistent": _self_consistent(paper["paper_verdict"])})
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


# ---- rendering ----------------------------------------------------------------------------------
VERDICT_MEANINGS = {
    "supported": "the whole 95 % interval satisfies the claim's decision",
    "contradicted": "none of the interval does",
    "inconclusive": "the interval straddles the decision: this profile's data cannot tell",
    "not_testable": "this profile cannot test it: a magnitude of the real benchmarks on the miniature, or a "
                    "regime precondition that fails here (the reason names it and its measured value)",
    "not_implemented": "a row it needs is not trained by this pipeline yet",
}


def _number(value: float, count: bool) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if math.isinf(value):
        return "never"
    return f"{value:.0f}" if count else f"{value:.3g}" if abs(value) < 10 else f"{value:.2f}"


def _counts(verdicts: pd.Series, names=VERDICTS) -> str:
    counts = verdicts.value_counts()
    return ", ".join(f"{int(counts.get(v, 0))} {v.replace('_', ' ')}" for v in names)


def _conditions_text(conditions: dict) -> list[str]:
    out = []
    for name, (_, meaning) in REGIME_CONDITIONS.items():
        condition = _as_condition(conditions.get(name))
        state = {True: "holds", False: "**does not hold**", None: "not measured"}[condition.met]
        out.append(f"* `{name}` ({meaning}): {state} — {condition.detail}")
    return out


def to_markdown(reg: Registry, frame: pd.DataFrame, boot: Bootstrap, conditions: dict | None = None) -> str:
    s = boot.settings
    conditions = conditions if conditions is not None else profile_conditions(reg)
    contradicted = frame.loc[frame["paper_verdict"] == "contradicted", "claim_id"].tolist()
    out = ["# Claims scorecard", "",
           f"Profile `{reg.profile_name}`: {len(frame)} claims — {_counts(frame['verdict'])}.", "",
           f"On the paper's own printed numbers, by the same rules: {_counts(frame['paper_verdict'], VERDICTS[:4])}"
           + (f"; the paper's own numbers contradict {', '.join(f'`{c}`' for c in contradicted)}." if contradicted
              else "."), "",
           "Regime preconditions of this profile (results/stats/regime.json; a claim that requires one that does "
           "not hold is not testable here):", "", *_conditions_text(conditions), "",
           "Each claim of the paper is a computable statistic over this profile's tables and records "
           f"(src/hnclip/report/claims.yaml), with a {s.confidence:.0%} percentile bootstrap interval over test "
           f"queries (and seeds; paired across runs on the same queries; {s.resamples} resamples, seed {s.seed}). "
           "Counts of \"all N\" claims take the tie tolerance their decision states: a reproduction at the "
           "paper's test-set sizes cannot resolve a smaller difference. Sanity checks hold nearly by construction "
           "(L_HN is L_CLIP on logits shifted by γG ≥ 0) and are judged per run.", ""]
    out += [f"* **{v.replace('_', ' ')}**: {meaning}" for v, meaning in VERDICT_MEANINGS.items()]
    if reg.profile_name != "paper":
        out += ["", "> The embedded miniature tests directions of effect; claims about the real benchmarks' magnitudes "
                    "are not testable on it."]
    out += ["", "| claim | paper | on the paper's numbers | reproduced [95 % CI] | verdict | decision |",
            "|---|---|---|---|---|---|"]
    specs = {c["claim_id"]: c for c in claims()}
    for rec in frame.to_dict("records"):
        spec = specs.get(rec["claim_id"], {"statistic": {}})
        count = str(spec["statistic"].get("reduce", "")).startswith("count")
        reproduced = _number(rec["reproduced_value"], count)
        if not math.isnan(rec["ci_low"]):
            reproduced += f" [{_number(rec['ci_low'], count)}, {_number(rec['ci_high'], count)}]"
        on_paper = rec["paper_verdict"].replace("_", " ")
        if not (isinstance(rec["paper_number"], float) and math.isnan(rec["paper_number"])):
            on_paper = f"{_number(rec['paper_number'], count)}: {on_paper}"
        label = "sanity check; " if rec["sanity_check"] else ""
        cells = [f"**{rec['claim_id']}** ({label}{rec['where']}): “{rec['quote']}”", rec["paper_value"], on_paper,
                 reproduced, rec["verdict"].replace("_", " "), f"{rec['decision']}: {spec.get('why', '')}"]
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")  # quotes hold |Δ|
    out += ["", "## Evidence and reasons", ""]
    for rec in frame.to_dict("records"):
        details = [text for text in (rec["reason"], rec["evidence"]) if isinstance(text, str) and text]
        out.append(f"* **{rec['claim_id']}**: " + (" — ".join(details) if details else "–"))
    return "\n".join(out) + "\n"


def claims_inputs(reg: Registry) -> list[Path]:
    """Every file the scorecard may read: the tables its claims name (with their evaluations), the
    caption statistics, the timing table, the training records of the probed runs and the regime report."""
    def tables_of(statistic: dict) -> set[str]:
        named = set()
        for key, value in statistic.items():
            if key in ("difference", "concat"):
                named |= set().union(*(tables_of(s) for s in value))
            elif isinstance(value, dict) and "table" in value:
                named |= {value["table"], value.get("b_table", value["table"])}
                named |= {row_of(b, value["table"])[1] for _, bs in value.get("pairs", [])
                          for b in ([bs] if isinstance(bs, str) else bs)}
        return named
    named = set().union(*(tables_of(c["statistic"]) for c in claims()))
    tables = [t for t in reg.tables if t in named]
    files = [paths.table(t, ext) for t in tables for ext in ("csv", "provenance.json")]
    files += [paths.evaluation(run, bench) for run, bench in reg.evaluations(tables)]
    files += [paths.stats(b) for b in reg.params["benchmarks"]]
    files += [paths.table(t, "csv") for t, spec in reg.params.get("derived_tables", {}).items()
              if spec["kind"] == "timing" and t in named]
    probed = {s["probe"]["figure"] for c in claims() for s in _leaves(c["statistic"]) if "probe" in s}
    files += sorted({paths.run_record(cell.run_id) for name in probed if name in reg.params["figures"]
                     for cell in reg.figure_cells(reg.params["figures"][name])})
    if reg.params.get("regime_targets"):
        files.append(paths.regime_report("json"))
    return list(dict.fromkeys(files))


def _leaves(statistic: dict) -> list[dict]:
    if "difference" in statistic or "concat" in statistic:
        return [leaf for s in statistic.get("difference", statistic.get("concat")) for leaf in _leaves(s)]
    return [statistic]


def build_claims(reg: Registry) -> list[Path]:
    """results/claims.csv, results/claims.md and their provenance record."""
    started = time.time()
    boot = Bootstrap(BootstrapSettings.from_params(reg.params))
    conditions = profile_conditions(reg)
    frame = scorecard(reg, boot)
    write_text(CLAIMS_CSV, frame.to_csv(index=False))
    write_text(CLAIMS_MD, to_markdown(reg, frame, boot, conditions))
    evidence = {file for text in frame["evidence"] if isinstance(text, str) and text for file in _files(text)}
    inputs = {f"evidence:{f}": f for f in sorted(evidence)}
    if paths.regime_report("json").is_file() and reg.params.get("regime_targets"):
        inputs["regime"] = paths.regime_report("json")
    record = provenance.record(
        "claims", inputs=inputs, wall_time_s=time.time() - started,
        params={"profile": reg.profile_name, "bootstrap": vars(boot.settings), "claims": claims()},
        extra={"verdicts": dict(zip(frame["claim_id"], frame["verdict"])),
               "paper_verdicts": dict(zip(frame["claim_id"], frame["paper_verdict"])),
               "preconditions": {name: _as_condition(conditions.get(name)).met for name in REGIME_CONDITIONS},
               "outputs": {str(p): provenance.file_sha256(p) for p in (CLAIMS_CSV, CLAIMS_MD)}})
    write_json(CLAIMS_PROVENANCE, record)
    return [CLAIMS_CSV, CLAIMS_MD, CLAIMS_PROVENANCE]


def _files(evidence: str) -> list[str]:
    return [part.split("[", 1)[0] for part in evidence.split("; ")]
