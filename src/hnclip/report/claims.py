"""The claims scorecard: every quantitative claim of the paper (claims.yaml) judged on this profile's
results, with its 95 % interval, as results/claims.csv and results/claims.md.

A claim's statistic is computed from "items" (one value per cell, contrast or benchmark, each as draws:
estimate then bootstrap replicates, see hnclip.report.effects) reduced to one number; its decision
(e.g. "count >= 8", "> 0", "between -1 and 1") gives the verdict:
  supported       the whole 95 % interval satisfies the decision (without an interval: the estimate)
  contradicted    none of the interval does
  inconclusive    the interval straddles the decision
  not_testable    the profile cannot test it (the reason says why: e.g. a magnitude of the real
                  benchmarks on the miniature, a table or figure this profile does not build)
  not_implemented a cell it needs belongs to a row this pipeline does not train yet
The same statistics run on the paper's own printed numbers (`PaperSource`), which the tests use to
check every claim definition against the paper.
"""
from __future__ import annotations

import itertools
import math
import time
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
           "decision", "reason", "where"]
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

    def probe(self, figure: str, method: str | None) -> list[dict]:
        spec = self.reg.params["figures"].get(figure)
        if spec is None:
            raise CellUnavailable("not drawn by this profile", figure)
        runs = sorted({c.run_id for c in self.reg.figure_cells(spec) if method in (None, c.method)})
        records = []
        for run_id in runs:
            path = paths.run_dir(run_id) / "grad_probe.jsonl"
            if path.is_file():
                records += read_jsonl(path)
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
        if "timing_ratio" in statistic:
            return "one timed run per method"
        if "caption_geometry" in statistic:
            return "the caption statistics keep no per-caption values"
        return "an evaluation record it reads holds no per-query ranks (evaluated before they were kept: rerun it)"

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


class PaperSource:
    """The paper's printed tables (best epoch only; no probe records): the claims on its own numbers."""

    def __init__(self):
        self._tables: dict[str, PaperCells] = {}
        self.evidence: list[tuple[str, str]] = []

    def _table(self, table: str) -> PaperCells:
        from hnclip.report.paper_reference import table_names
        if table not in table_names():  # e.g. Table X1: a control beyond the paper
            raise CellUnavailable("the paper prints no values of this table", table)
        return self._tables.setdefault(table, PaperCells(table))

    def has(self, table: str, row: str, part: tuple[str, str, str]) -> bool:
        return not math.isnan(self._table(table).value(row, Column(*part, parts=(part,))))

    def cell(self, table: str, row: str, part: tuple[str, str, str], selection) -> np.ndarray:
        if selection not in (None, "best"):
            raise CellUnavailable(f"the paper prints no {selection!r}-epoch values", f"{table} {row}")
        return np.array([self._table(table).value(row, Column(*part, parts=(part,)))])

    def probe(self, figure: str, method: str | None) -> list[dict]:
        raise CellUnavailable("the paper publishes no gradient-probe records", figure)

    @staticmethod
    def no_interval(statistic: dict) -> str:
        return "the paper's printed numbers"

    def caption_geometry(self, benchmark: str, field: str) -> np.ndarray:
        return np.array([self._table("tableA1").value(benchmark, Column(benchmark, "none", PAPER_GEOMETRY[field], ()))])

    def timing(self, table: str, row: str, metric: str) -> float:
        benchmark = self._table(table).benchmark_of(row)
        return self._table(table).value(row, Column(benchmark, "none", metric, ()))


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
    parts = []
    for part in column.parts:
        try:
            parts.append(source.cell(table, row, part, selection))
        except CellUnavailable as exc:
            if exc.status != NOT_IMPLEMENTED:
                raise
            missing.add(f"{table} {row}")
    return np.mean(np.stack(aligned(*parts)), axis=0) if len(parts) == len(column.parts) else None


def _contrast(spec: dict, source) -> list[np.ndarray]:
    """a − b (or − the best of several b) for each pair and column the a row has."""
    table, b_table = spec["table"], spec.get("b_table", spec["table"])
    a_selection = spec.get("a_selection", spec.get("selection"))
    b_selection = spec.get("b_selection", spec.get("selection"))
    items, missing = [], set()
    for a, b in spec["pairs"]:
        for column in columns(spec["columns"]):
            if not all(source.has(table, a, part) for part in column.parts):
                continue  # e.g. Table A9's rows each have one benchmark
            a_draws = _column_draws(source, table, a, column, a_selection, missing)
            b_draws = [_column_draws(source, b_table, row, column, b_selection, missing)
                       for row in ([b] if isinstance(b, str) else b)]
            if a_draws is not None and all(d is not None for d in b_draws):
                arrays = aligned(a_draws, *b_draws)
                items.append(arrays[0] - np.max(np.stack(arrays[1:]), axis=0))
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


def _share(mask: np.ndarray) -> np.ndarray:
    return mask.mean(axis=-1)


def _probe(spec: dict, source) -> list[np.ndarray]:
    records = source.probe(spec["figure"], spec.get("method"))
    unit = f"probe:{spec['figure']}:{spec.get('method')}"
    field, measure = spec["field"], spec["measure"]
    if "epoch" in spec:
        records = [r for r in records if r["epoch"] == spec["epoch"]]
    if measure == "min_epoch_share_at_least":
        # The epoch with the lowest share, resampled within that epoch: a minimum over many resampled
        # epochs would sit below the estimate in nearly every replicate.
        per_epoch = {e: np.array([r[field] >= spec["threshold"] for r in records if r["epoch"] == e], dtype=float)
                     for e in sorted({r["epoch"] for r in records})}
        epoch = min(per_epoch, key=lambda e: per_epoch[e].mean())
        return [source.resample(f"{unit}:epoch{epoch}", per_epoch[epoch], _share)]
    if measure == "median_ratio":
        values = np.array([r[field] / r[spec["over"]] for r in records if r[spec["over"]] > 0])
        return [source.resample(unit, values, lambda v: np.median(v, axis=-1))]
    if measure in ("share_below", "share_true"):
        values = np.array([r[field] < spec["threshold"] if measure == "share_below" else bool(r[field])
                           for r in records], dtype=float)
        return [source.resample(unit, values, _share)]
    values = np.array([r[field] for r in records if r[field] is not None], dtype=float)
    reducers = {"mean": lambda v: v.mean(axis=-1), "median": lambda v: np.median(v, axis=-1),
                "share_positive": lambda v: _share(v > 0)}
    return [source.resample(unit, values, reducers[measure])]


def _caption_geometry(spec: dict, source) -> list[np.ndarray]:
    return [source.caption_geometry(b, spec["field"]) for b in spec["benchmarks"]]


def _timing_ratio(spec: dict, source) -> list[np.ndarray]:
    numerator = source.timing(spec["table"], spec["numerator"], spec["metric"])
    return [np.array([numerator / source.timing(spec["table"], spec["denominator"], spec["metric"])])]


REDUCERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "min": lambda x: x.min(axis=0), "max": lambda x: x.max(axis=0), "mean": lambda x: x.mean(axis=0),
    "abs_mean": lambda x: np.abs(x).mean(axis=0), "count_positive": lambda x: (x > 0).sum(axis=0).astype(float),
    "count_nonnegative": lambda x: (x >= 0).sum(axis=0).astype(float),
}


def items(statistic: dict, source) -> list[np.ndarray]:
    """A statistic's items (reduced to one when it names a `reduce`)."""
    if "difference" in statistic:
        first, second = (items(s, source) for s in statistic["difference"])
        if len(first) != len(second) and 1 not in (len(first), len(second)):
            raise ValueError(f"difference of {len(first)} and {len(second)} items")
        n = max(len(first), len(second))  # one item against several: the one is repeated
        first, second = (x * n if len(x) == 1 else x for x in (first, second))
        out = [np.subtract(*aligned(f, s)) for f, s in zip(first, second)]
    else:
        kinds = {"contrast": _contrast, "spread": _spread, "probe": _probe, "caption_geometry": _caption_geometry,
                 "timing_ratio": _timing_ratio}
        (kind,) = [k for k in kinds if k in statistic]
        out = kinds[kind](statistic[kind], source)
    reduce = statistic.get("reduce")
    if reduce is None:
        return out
    if reduce == "value":
        if len(out) != 1:
            raise ValueError(f"`reduce: value` needs one item, got {len(out)}")
        return out
    return [REDUCERS[reduce](np.stack(aligned(*out)))]


def statistic_draws(statistic: dict, source) -> np.ndarray:
    out = items(statistic, source)
    if len(out) != 1:
        raise ValueError(f"a claim's statistic must reduce to one value, got {len(out)} items (add `reduce`)")
    return out[0]


# ---- verdicts ------------------------------------------------------------------------------------
def decision_text(decision: dict) -> str:
    if decision["op"] == "between":
        return f"between {decision['low']:g} and {decision['high']:g}"
    return f"{decision['op']} {decision['threshold']:g}"


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


def profile_conditions(reg: Registry) -> dict[str, bool]:
    """What a claim's `requires` may name: `real_data` (every dataset of the profile is the real one)."""
    return {"real_data": all(d["kind"] == "real" for d in reg.profile["datasets"].values())}


def evaluate(claim: dict, source, conditions: dict[str, bool], boot: Bootstrap) -> dict:
    """One row of the scorecard."""
    decision = claim.get("real_data_decision", claim["decision"]) if conditions.get("real_data") else claim["decision"]
    row = {"claim_id": claim["claim_id"], "quote": claim["quote"], "paper_value": claim["paper_value"],
           "reproduced_value": math.nan, "ci_low": math.nan, "ci_high": math.nan, "evidence": "",
           "decision": decision_text(decision), "reason": "", "where": claim["where"]}
    unmet = [reason for condition, reason in claim.get("requires", {}).items() if not conditions.get(condition)]
    if unmet:
        return {**row, "verdict": "not_testable", "reason": "; ".join(unmet)}
    source.evidence = []
    try:
        draws = statistic_draws(claim["statistic"], source)
    except CellUnavailable as exc:
        verdict = "not_implemented" if exc.status == NOT_IMPLEMENTED else "not_testable"
        return {**row, "verdict": verdict, "reason": str(exc), "evidence": format_evidence(source.evidence)}
    value, low, high = summarise(draws, boot)
    reason = "" if not math.isnan(low) else f"no interval: {source.no_interval(claim['statistic'])}"
    return {**row, "reproduced_value": value, "ci_low": low, "ci_high": high,
            "verdict": decide(decision, value, low, high), "reason": reason,
            "evidence": format_evidence(source.evidence)}


def scorecard(reg: Registry, boot: Bootstrap) -> pd.DataFrame:
    source, conditions = ReproducedSource(reg, boot), profile_conditions(reg)
    return pd.DataFrame([evaluate(c, source, conditions, boot) for c in claims()]).reindex(columns=COLUMNS)


# ---- rendering ----------------------------------------------------------------------------------
VERDICT_MEANINGS = {
    "supported": "the whole 95 % interval satisfies the claim's decision",
    "contradicted": "none of the interval does",
    "inconclusive": "the interval straddles the decision: this profile's data cannot tell",
    "not_testable": "this profile cannot test it (reason given)",
    "not_implemented": "a row it needs is not trained by this pipeline yet",
}


def _number(value: float, count: bool) -> str:
    if value is None or math.isnan(value):
        return "–"
    return f"{value:.0f}" if count else f"{value:.3g}" if abs(value) < 10 else f"{value:.2f}"


def to_markdown(reg: Registry, frame: pd.DataFrame, boot: Bootstrap) -> str:
    counts = frame["verdict"].value_counts()
    s = boot.settings
    out = ["# Claims scorecard", "",
           f"Profile `{reg.profile_name}`: {len(frame)} claims — "
           + ", ".join(f"{int(counts.get(v, 0))} {v.replace('_', ' ')}" for v in VERDICTS) + ".", "",
           "Each claim of the paper is a computable statistic over this profile's tables and records "
           f"(src/hnclip/report/claims.yaml), with a {s.confidence:.0%} percentile bootstrap interval over test "
           f"queries (and seeds; paired across runs on the same queries; {s.resamples} resamples, seed {s.seed}).", ""]
    out += [f"* **{v.replace('_', ' ')}**: {meaning}" for v, meaning in VERDICT_MEANINGS.items()]
    if reg.profile_name != "paper":
        out += ["", "> The embedded miniature tests directions of effect; claims about the real benchmarks' magnitudes "
                    "are not testable on it."]
    out += ["", "| claim | paper | reproduced [95 % CI] | verdict | decision |", "|---|---|---|---|---|"]
    why = {c["claim_id"]: c.get("why", "") for c in claims()}
    is_count = {c["claim_id"]: c["statistic"].get("reduce", "").startswith("count") for c in claims()}
    for rec in frame.to_dict("records"):
        count = is_count[rec["claim_id"]]
        reproduced = _number(rec["reproduced_value"], count)
        if not math.isnan(rec["ci_low"]):
            reproduced += f" [{_number(rec['ci_low'], count)}, {_number(rec['ci_high'], count)}]"
        cells = [f"**{rec['claim_id']}** ({rec['where']}): “{rec['quote']}”", rec["paper_value"], reproduced,
                 rec["verdict"].replace("_", " "), f"{rec['decision']}: {why[rec['claim_id']]}"]
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")  # quotes hold |Δ|
    out += ["", "## Evidence and reasons", ""]
    for rec in frame.to_dict("records"):
        details = [text for text in (rec["reason"], rec["evidence"]) if text]
        out.append(f"* **{rec['claim_id']}**: " + (" — ".join(details) if details else "–"))
    return "\n".join(out) + "\n"


def claims_inputs(reg: Registry) -> list[Path]:
    """Every file the scorecard may read: the tables its claims name (with their evaluations), the
    caption statistics, the timing table and the training records of the probed runs."""
    named = {c["statistic"][k]["table"] for c in claims() for k in ("contrast", "spread", "timing_ratio")
             if k in c["statistic"]}
    named |= {s[k]["table"] for c in claims() for s in c["statistic"].get("difference", []) for k in s
              if isinstance(s[k], dict) and "table" in s[k]}
    named |= {c["statistic"]["contrast"]["b_table"] for c in claims()
              if "b_table" in c["statistic"].get("contrast", {})}
    tables = [t for t in reg.tables if t in named]
    files = [paths.table(t, ext) for t in tables for ext in ("csv", "provenance.json")]
    files += [paths.evaluation(run, bench) for run, bench in reg.evaluations(tables)]
    files += [paths.stats(b) for b in reg.params["benchmarks"]]
    files += [paths.table(t, "csv") for t, spec in reg.params.get("derived_tables", {}).items()
              if spec["kind"] == "timing" and t in named]
    probed = {c["statistic"]["probe"]["figure"] for c in claims() if "probe" in c["statistic"]}
    files += sorted({paths.run_record(cell.run_id) for name in probed if name in reg.params["figures"]
                     for cell in reg.figure_cells(reg.params["figures"][name])})
    return list(dict.fromkeys(files))


def build_claims(reg: Registry) -> list[Path]:
    """results/claims.csv, results/claims.md and their provenance record."""
    started = time.time()
    boot = Bootstrap(BootstrapSettings.from_params(reg.params))
    frame = scorecard(reg, boot)
    write_text(CLAIMS_CSV, frame.to_csv(index=False))
    write_text(CLAIMS_MD, to_markdown(reg, frame, boot))
    evidence = {file for text in frame["evidence"] if text for file in _files(text)}
    record = provenance.record(
        "claims", inputs={f"evidence:{f}": f for f in sorted(evidence)}, wall_time_s=time.time() - started,
        params={"profile": reg.profile_name, "bootstrap": vars(boot.settings), "claims": claims()},
        extra={"verdicts": dict(zip(frame["claim_id"], frame["verdict"])),
               "outputs": {str(p): provenance.file_sha256(p) for p in (CLAIMS_CSV, CLAIMS_MD)}})
    write_json(CLAIMS_PROVENANCE, record)
    return [CLAIMS_CSV, CLAIMS_MD, CLAIMS_PROVENANCE]


def _files(evidence: str) -> list[str]:
    return [part.split("[", 1)[0] for part in evidence.split("; ")]
