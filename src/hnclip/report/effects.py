"""Effects: the contrasts the paper draws from each table, the paper's contrast beside the reproduced one
with its 95 % interval, and whether their signs agree; and every reproduced cell with its interval.

Which contrasts a table carries is data (the `contrasts` section of claims.yaml): every gamma against
gamma 0, each framework + L_HN against the framework, HN-CLIP against each baseline and against the
column-wise strongest one, recomputed against frozen G, a second seed against the first, 20 %
HN-CLIP against the strongest baseline trained on all the data (another table), and named pairs of
rows (Table X1's controls). A contrast is taken
per column (benchmark, direction, Recall@K), per benchmark on mean R@1 over the two directions (the
paper's "average R@1"), and on the table's Avg (mean of its R@1 cells) where the table has one.

Reproduced cells are read from a table's provenance record (per seed: run, evaluation record) and the
per-query ranks of the evaluation records it names. A value travels as "draws": element 0 the
estimate, elements 1.. its bootstrap replicates (absent when the records hold no ranks), so any
statistic of several cells is computed once, estimate and replicates alike.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from hnclip import provenance
from hnclip.config import paths
from hnclip.config.cells import DIRECTION_LABELS, canonical_row
from hnclip.config.params import read_yaml
from hnclip.config.registry import NOT_IMPLEMENTED, Registry
from hnclip.errors import StaleArtifactError
from hnclip.evaluation.bootstrap import Bootstrap, BootstrapSettings, outcomes
from hnclip.io import package_text, read_json, write_json, write_text

DEFINITIONS = "contrasts.yaml"
NO_RANKS = "no per-query ranks recorded (evaluated before ranks were kept): no interval; rerun its evaluation"
VALUE_TOLERANCE = 1e-3  # a recall recomputed from the ranks vs the float32 value the record holds (percent)


def effects_path(table: str, ext: str) -> Path:
    return paths.RESULTS / "effects" / f"{table}.{ext}"


@functools.lru_cache(maxsize=1)
def definitions() -> dict:
    """contrasts.yaml: the contrasts the paper draws from each table."""
    return read_yaml(package_text(__package__, DEFINITIONS))  # libyaml's loader: the Snakefile reads it too


# ---- draws: an estimate and its bootstrap replicates ------------------------------------------------
def aligned(*arrays: np.ndarray) -> list[np.ndarray]:
    """Estimates only when any operand lacks replicates: its uncertainty would otherwise be ignored."""
    if any(len(a) == 1 for a in arrays):
        return [a[:1] for a in arrays]
    return list(arrays)


def summarise(draws: np.ndarray, boot: Bootstrap) -> tuple[float, float, float]:
    """(estimate, interval low, interval high); NaN bounds when there are no replicates."""
    if len(draws) == 1:
        return float(draws[0]), math.nan, math.nan
    return (float(draws[0]), *boot.interval(draws[1:]))


class CellUnavailable(LookupError):
    """Something a statistic needs is not there: `status` says why (not implemented yet, not built by
    this profile, ...), `what` names it."""

    def __init__(self, status: str, what: str):
        super().__init__(f"{what}: {status}")
        self.status, self.what = status, what


# ---- reproduced cells -----------------------------------------------------------------------------
class TableCells:
    """One built table's reproduced cells: per-seed runs and evaluation records from its provenance
    record, values and per-query ranks from those records (at the table's epoch selection or another)."""

    def __init__(self, table: str, boot: Bootstrap):
        self.table, self.boot = table, boot
        record = read_json(paths.table(table, "provenance.json"))
        self.selection = record.get("selection", "best")
        self._cells: dict[tuple, list[dict]] = {}
        for cell in record["cells"]:
            self._cells.setdefault((cell["row"], cell["benchmark"], cell["direction"], cell["metric"]), []).append(cell)
        self.rows = list(dict.fromkeys(key[0] for key in self._cells))
        self.columns = list(dict.fromkeys(key[1:] for key in self._cells))
        self._records: dict[str, dict] = {}

    def has(self, row: str, column: tuple[str, str, str]) -> bool:
        return (row, *column) in self._cells

    def seeds(self, row: str, column: tuple[str, str, str]) -> list[int]:
        return sorted(c["seed"] for c in self._cells.get((row, *column), []))

    def eval_files(self, row: str, column: tuple[str, str, str]) -> list[str]:
        return [c["eval_file"] for c in self._cells.get((row, *column), []) if c.get("eval_file")]

    def _record(self, eval_file: str) -> dict:
        if eval_file not in self._records:
            self._records[eval_file] = read_json(eval_file)
        return self._records[eval_file]

    def _entry(self, eval_file: str, selection: str | int) -> dict:
        record = self._record(eval_file)
        if selection in ("best", "last"):
            return record[selection]
        for entry in record.get("per_epoch", []):
            if entry["epoch"] == selection:
                return entry
        raise CellUnavailable(f"epoch {selection} not recorded", eval_file)

    def epochs(self, row: str, column: tuple[str, str, str]) -> list[int]:
        """The epochs every seed's evaluation record of a cell holds (its per-epoch trajectory)."""
        per_seed = self._cells.get((row, *column), [])
        if not per_seed:
            return []
        if any(c["status"] != "ok" or not c.get("eval_file") for c in per_seed):
            raise CellUnavailable(NOT_IMPLEMENTED, f"{self.table} {row}")
        held = [{e["epoch"] for e in self._record(c["eval_file"]).get("per_epoch", [])} for c in per_seed]
        return sorted(set.intersection(*held))

    def draws(self, row: str, column: tuple[str, str, str], selection: str | int | None = None) -> np.ndarray:
        """Estimate (mean over seeds) and replicates of one cell, percent."""
        benchmark, direction, metric = column
        per_seed = sorted(self._cells.get((row, *column), []), key=lambda c: c["seed"])
        what = f"{self.table} {row}/{benchmark}/{direction}/{metric}"
        if not per_seed:
            raise CellUnavailable(f"not a cell of {self.table}", what)
        if any(c["status"] != "ok" or not c.get("eval_file") for c in per_seed):
            raise CellUnavailable(NOT_IMPLEMENTED, what)
        entries = [self._entry(c["eval_file"], selection or self.selection) for c in per_seed]
        estimate = float(np.mean([e["metrics"][direction][metric] for e in entries]))
        ranks = [e["metrics"].get("ranks", {}).get(direction) for e in entries]
        if any(r is None for r in ranks):
            return np.array([estimate])
        cell = outcomes(ranks, int(metric.split("@")[1]), benchmark, [c["seed"] for c in per_seed])
        if abs(cell.value - estimate) > VALUE_TOLERANCE:
            raise StaleArtifactError(f"{what}: the ranks give {cell.value:.4f} but the records say {estimate:.4f}; "
                                     f"rerun the evaluations {[c['eval_file'] for c in per_seed]}")
        return np.concatenate([[estimate], self.boot.replicates(cell)])

    def reference(self, row: str, column: tuple[str, str, str],
                  selection: str | int | None = None) -> list[tuple[str, str]]:
        """Where a cell comes from, as (file, item): the table cell (`hnclip lineage` follows it), or
        for another epoch selection the evaluation records."""
        if selection is None or selection == self.selection:
            return [(str(paths.table(self.table, "csv")), f"{row}/{'/'.join(column)}")]
        return [(f, f"{selection}/{'/'.join(column[1:])}") for f in self.eval_files(row, column)]


def format_evidence(references: list[tuple[str, str]]) -> str:
    """(file, item) pairs as "file[item, item]; file[...]", files in first-seen order."""
    grouped: dict[str, list[str]] = {}
    for file, item in references:
        if item not in grouped.setdefault(file, []):
            grouped[file].append(item)
    return "; ".join(f"{file}[{', '.join(items)}]" if any(items) else file for file, items in grouped.items())


class ReproducedCells:
    """The built tables' cells, each table read once, with one bootstrap (shared resamples)."""

    def __init__(self, boot: Bootstrap):
        self.boot = boot
        self._tables: dict[str, TableCells] = {}

    def table(self, name: str) -> TableCells:
        if name not in self._tables:
            if not paths.table(name, "provenance.json").is_file():
                raise CellUnavailable("table not built by this profile", name)
            self._tables[name] = TableCells(name, self.boot)
        return self._tables[name]


# ---- columns and contrasts ------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    """A table column, or a summary of several (mean R@1 of a benchmark, the table's Avg)."""
    benchmark: str
    direction: str
    metric: str
    parts: tuple[tuple[str, str, str], ...]

    @property
    def key(self) -> str:
        return f"{self.benchmark}/{self.direction}/{self.metric}"


def plain(column: tuple[str, str, str]) -> Column:
    return Column(*column, parts=(column,))


def table_columns(cells: TableCells, average: bool) -> list[Column]:
    """Every column, each benchmark's mean R@1 over both directions, and (`average`) the mean of all R@1 cells."""
    columns = [plain(c) for c in cells.columns]
    r1 = [c for c in cells.columns if c[2] == "R@1"]
    for bench in dict.fromkeys(c[0] for c in r1):
        both = tuple(c for c in r1 if c[0] == bench)
        if len(both) == 2:
            columns.append(Column(bench, "both", "mean_r1", both))
    if average and r1:
        columns.append(Column("all", "both", "avg", tuple(r1)))
    return columns


def column_draws(cells: TableCells, row: str, column: Column, selection: str | int | None = None) -> np.ndarray:
    parts = aligned(*(cells.draws(row, part, selection) for part in column.parts))
    return np.mean(np.stack(parts), axis=0)


@dataclass(frozen=True)
class Contrast:
    """a − b, or a − the column-wise best of several rows b (of `b_table`, default the same table)."""
    a: str
    b: tuple[str, ...]
    b_table: str | None = None

    @property
    def label(self) -> str:
        other = self.b[0] if len(self.b) == 1 else f"best of ({', '.join(self.b)})"
        return f"{self.a} − {other}" + (f" [{self.b_table}]" if self.b_table else "")


def _versus(focus: str, others: list[str]) -> list[Contrast]:
    return [Contrast(focus, (o,)) for o in others] + ([Contrast(focus, tuple(others))] if len(others) > 1 else [])


def contrasts_of(spec: dict, rows: list[str]) -> list[Contrast]:
    """The contrasts a table's `contrasts` entry names, over the rows the table has."""
    out: list[Contrast] = []
    if "focus" in spec and spec["focus"] in rows:
        out += _versus(spec["focus"], [r for r in rows if r != spec["focus"]])
    if "reference" in spec and spec["reference"] in rows:
        out += [Contrast(r, (spec["reference"],)) for r in rows if r != spec["reference"]]
    if "pairs" in spec:
        out += [Contrast(r + spec["pairs"], (r,)) for r in rows if r + spec["pairs"] in rows]
    if "groups" in spec:  # rows "<group>/<method>": the focus method vs the others of its group
        groups: dict[str, list[str]] = {}
        for row in rows:
            groups.setdefault(row.rsplit("/", 1)[0], []).append(row)
        for group, members in groups.items():
            focus = f"{group}/{spec['groups']}"
            if focus in members:
                out += _versus(focus, [m for m in members if m != focus])
    if "seeds" in spec:  # rows "<method>/seed=<s>": each later seed vs the first
        methods: dict[str, list[str]] = {}
        for row in rows:
            methods.setdefault(row.split(spec["seeds"])[0], []).append(row)
        out += [Contrast(later, (members[0],)) for members in methods.values() for later in members[1:]]
    out += [Contrast(a, (b,)) for a, b in spec.get("versus", []) if a in rows and b in rows]
    out += [Contrast(item["a"], tuple(item["b"]), item["table"]) for item in spec.get("versus_table", [])
            if item["a"] in rows]
    return out


def contrast_draws(cells: ReproducedCells, table: str, contrast: Contrast, column: Column,
                   selection: str | int | None = None) -> np.ndarray:
    a = column_draws(cells.table(table), contrast.a, column, selection)
    other = cells.table(contrast.b_table or table)
    arrays = aligned(a, *(column_draws(other, b, column, selection) for b in contrast.b))
    return arrays[0] - np.max(np.stack(arrays[1:]), axis=0)


# ---- the paper's side -----------------------------------------------------------------------------
class PaperCells:
    """The paper's printed values of a table (NaN where it prints none), summaries as the paper's own
    printed column where it has one (e.g. Table 3a's Avg), else the mean of the parts."""

    def __init__(self, table: str):
        from hnclip.report.paper_reference import paper_table, table_names
        self._values: dict[tuple, float] = {}
        self._benchmarks: dict[str, str] = {}
        if table in table_names():
            for rec in paper_table(table).to_dict("records"):
                row = canonical_row(rec["row"])
                self._values[(row, rec["benchmark"], rec["direction"], rec["metric"])] = rec["value"]
                self._benchmarks.setdefault(row, rec["benchmark"])

    def benchmark_of(self, row: str) -> str:
        """The benchmark of a row's first printed cell (tables whose rows each have one, e.g. A1, A3)."""
        return self._benchmarks.get(canonical_row(row), "")

    def value(self, row: str, column: Column) -> float:
        printed = self._values.get((canonical_row(row), column.benchmark, column.direction, column.metric))
        if printed is not None:
            return printed
        parts = [self._values.get((canonical_row(row), *part), math.nan) for part in column.parts]
        return float(np.mean(parts)) if parts else math.nan

    def contrast(self, contrast: Contrast, column: Column, other: "PaperCells") -> float:
        bs = [other.value(b, column) for b in contrast.b]
        return self.value(contrast.a, column) - max(bs) if bs else math.nan


# ---- one table's effects ------------------------------------------------------------------------
def _signs(paper: float, reproduced: float, low: float, high: float) -> tuple[object, object]:
    """(do the signs agree, does the interval exclude 0); None where a sign or the interval is missing."""
    agree = None if not (np.isfinite(paper) and np.isfinite(reproduced)) or 0 in (paper, reproduced) else \
        bool(np.sign(paper) == np.sign(reproduced))
    excludes_zero = None if not (np.isfinite(low) and np.isfinite(high)) else bool(low > 0 or high < 0)
    return agree, excludes_zero


def _contrast_rows(reg: Registry, cells: ReproducedCells, table: str, spec: dict) -> list[dict]:
    own, paper = cells.table(table), PaperCells(table)
    average = bool(reg.params["tables"][table].get("average_column"))
    rows = []
    for contrast in contrasts_of(spec, own.rows):
        other = cells.table(contrast.b_table or table)
        other_paper = PaperCells(contrast.b_table) if contrast.b_table else paper
        columns = [c for c in table_columns(own, average)
                   if all(own.has(contrast.a, p) and all(other.has(b, p) for b in contrast.b) for p in c.parts)]
        base = {"table": table, "kind": "contrast", "contrast": contrast.label, "a": contrast.a,
                "b": "|".join(contrast.b), "b_table": contrast.b_table or table}
        per_column = []
        for column in columns:
            entry = {**base, "benchmark": column.benchmark, "direction": column.direction, "metric": column.metric,
                     "paper": paper.contrast(contrast, column, other_paper)}
            try:
                draws = contrast_draws(cells, table, contrast, column)
            except CellUnavailable as exc:
                rows.append({**entry, "reproduced": math.nan, "status": exc.status})
                continue
            if len(column.parts) == 1:
                per_column.append(draws)
            rows.append(_finish(entry, draws, cells.boot, _evidence(own, other, contrast, column.parts)))
        if spec.get("summary") == "max_abs" and per_column:  # Table A8's max |Δ| over the plain columns
            benchmark = columns[0].benchmark
            entry = {**base, "benchmark": benchmark, "direction": "both", "metric": "max_abs_delta",
                     "paper": paper.value(contrast.a, Column(benchmark, "both", "max_abs_delta", ()))}
            draws = np.max(np.abs(np.stack(aligned(*per_column))), axis=0)
            parts = tuple(p for c in columns if len(c.parts) == 1 for p in c.parts)
            rows.append(_finish(entry, draws, cells.boot, _evidence(own, other, contrast, parts)))
    return rows


def _finish(entry: dict, draws: np.ndarray, boot: Bootstrap, evidence: str) -> dict:
    reproduced, low, high = summarise(draws, boot)
    agree, excludes_zero = _signs(entry["paper"], reproduced, low, high)
    return {**entry, "reproduced": reproduced, "ci_low": low, "ci_high": high, "sign_agrees": agree,
            "ci_excludes_zero": excludes_zero, "status": "ok" if len(draws) > 1 else NO_RANKS, "evidence": evidence}


def _evidence(own: TableCells, other: TableCells, contrast: Contrast, parts) -> str:
    refs = [r for p in parts for r in own.reference(contrast.a, p)]
    return format_evidence(refs + [r for b in contrast.b for p in parts for r in other.reference(b, p)])


def _cell_rows(reg: Registry, cells: ReproducedCells, table: str) -> list[dict]:
    own, paper = cells.table(table), PaperCells(table)
    average = bool(reg.params["tables"][table].get("average_column"))
    rows = []
    for row in own.rows:
        for column in table_columns(own, average):
            if not all(own.has(row, p) for p in column.parts):
                continue
            entry = {"table": table, "kind": "cell", "a": row, "benchmark": column.benchmark,
                     "direction": column.direction, "metric": column.metric, "paper": paper.value(row, column),
                     "n_seeds": len(own.seeds(row, column.parts[0]))}
            try:
                draws = column_draws(own, row, column)
            except CellUnavailable as exc:
                rows.append({**entry, "reproduced": math.nan, "status": exc.status})
                continue
            done = _finish(entry, draws, cells.boot, format_evidence([r for p in column.parts
                                                                      for r in own.reference(row, p)]))
            # levels are comparable only on the paper's own setting
            gap = done["reproduced"] - entry["paper"] if reg.profile_name == "paper" else math.nan
            rows.append({**done, "sign_agrees": None, "ci_excludes_zero": None, "reproduced_minus_paper": gap})
    return rows


COLUMNS = ["table", "kind", "contrast", "a", "b", "b_table", "benchmark", "direction", "metric", "paper",
           "reproduced", "ci_low", "ci_high", "sign_agrees", "ci_excludes_zero", "reproduced_minus_paper",
           "n_seeds", "status", "evidence"]


def effects_frame(reg: Registry, table: str, boot: Bootstrap) -> pd.DataFrame:
    """Contrast rows (the table's `contrasts` entry) then cell rows, in COLUMNS."""
    cells = ReproducedCells(boot)
    spec = definitions().get("contrasts", {}).get(table, {})
    spec = {**spec, "versus_table": [v for v in spec.get("versus_table", []) if v["table"] in reg.params["tables"]]}
    frame = pd.DataFrame(_contrast_rows(reg, cells, table, spec) + _cell_rows(reg, cells, table))
    return frame.reindex(columns=COLUMNS)


def referenced_tables(table: str, params: dict) -> list[str]:
    """The tables one table's effects read: itself and those of its cross-table contrasts."""
    spec = definitions().get("contrasts", {}).get(table, {})
    return list(dict.fromkeys([table] + [v["table"] for v in spec.get("versus_table", [])
                                         if v["table"] in params["tables"]]))


def effects_inputs(reg: Registry, table: str) -> list[Path]:
    """Every file one table's effects read: the tables' provenance records and CSVs, their evaluations."""
    tables = referenced_tables(table, reg.params)
    files = [paths.table(t, ext) for t in tables for ext in ("csv", "provenance.json")]
    return files + [paths.evaluation(run, bench) for run, bench in reg.evaluations(tables)]


# ---- rendering ----------------------------------------------------------------------------------
def column_label(reg: Registry, benchmark: str, direction: str, metric: str) -> str:
    if benchmark == "all":
        return "Avg R@1"
    label = reg.params["benchmarks"].get(benchmark, {}).get("label", benchmark)
    if metric == "mean_r1":
        return f"{label} mean R@1"
    if metric == "max_abs_delta":
        return f"{label} max \\|Δ\\|"  # escaped: a Markdown table cell
    return f"{label} {DIRECTION_LABELS.get(direction, direction)} {metric}"


def fmt(value, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def fmt_interval(value: float, low: float, high: float, signed: bool = False) -> str:
    text = fmt(value, signed)
    if value is None or math.isnan(value) or math.isnan(low):
        return text
    return f"{text} [{fmt(low, signed)}, {fmt(high, signed)}]"


def _sign_text(agree, excludes_zero) -> str:
    if agree is None or (isinstance(agree, float) and math.isnan(agree)):
        return "–"
    word = "yes" if agree else "no"
    return word if excludes_zero else f"{word} (interval includes 0)"


def to_markdown(reg: Registry, table: str, frame: pd.DataFrame, boot: Bootstrap) -> str:
    title = reg.params["tables"][table]["title"]
    s = boot.settings
    out = [f"# Effects — {title}", "",
           f"Profile `{reg.profile_name}`. Intervals: {s.confidence:.0%} percentile bootstrap over the test queries "
           f"({s.resamples} resamples, seed {s.seed}), and over seeds where a cell has several; a contrast resamples "
           "both runs on the same queries (paired). \"signs agree\": paper and reproduced contrast have the same sign "
           "(and the interval excludes 0 unless noted); – where either is 0.", ""]
    if reg.profile_name != "paper":
        out += ["> The miniature is a different scale from the paper: compare signs of effects, not levels.", ""]
    contrasts = frame[frame["kind"] == "contrast"]
    if not contrasts.empty:
        out += ["## Contrasts the paper draws", "",
                "| contrast | column | paper | reproduced [95 % CI] | signs agree |", "|---|---|---|---|---|"]
        for rec in contrasts.to_dict("records"):
            reproduced = rec["status"] if rec["status"] not in ("ok", NO_RANKS) else \
                fmt_interval(rec["reproduced"], rec["ci_low"], rec["ci_high"], signed=True)
            out.append(f"| {rec['contrast']} | {column_label(reg, rec['benchmark'], rec['direction'], rec['metric'])} "
                       f"| {fmt(rec['paper'], signed=True)} | {reproduced} "
                       f"| {_sign_text(rec['sign_agrees'], rec['ci_excludes_zero'])} |")
        out.append("")
    cells = frame[frame["kind"] == "cell"]
    paper_profile = reg.profile_name == "paper"
    out += ["## Reproduced cells", "",
            "| row | column | reproduced [95 % CI] | seeds | paper |"
            + (" reproduced − paper |" if paper_profile else ""),
            "|---|---|---|---|---|" + ("---|" if paper_profile else "")]
    for rec in cells.to_dict("records"):
        reproduced = rec["status"] if rec["status"] not in ("ok", NO_RANKS) else \
            fmt_interval(rec["reproduced"], rec["ci_low"], rec["ci_high"])
        line = (f"| {rec['a']} | {column_label(reg, rec['benchmark'], rec['direction'], rec['metric'])} | {reproduced} "
                f"| {rec['n_seeds']} | {fmt(rec['paper'])} |")
        out.append(line + (f" {fmt(rec['reproduced_minus_paper'], signed=True)} |" if paper_profile else ""))
    if (frame["status"] == NO_RANKS).any():
        out += ["", f"Cells without an interval: {NO_RANKS}."]
    return "\n".join(out) + "\n"


def build_effects(reg: Registry, table: str) -> list[Path]:
    """results/effects/<table>.csv and .md, and their provenance record."""
    started = time.time()
    boot = Bootstrap(BootstrapSettings.from_params(reg.params))
    frame = effects_frame(reg, table, boot)
    outputs = {ext: effects_path(table, ext) for ext in ("csv", "md")}
    write_text(outputs["csv"], frame.to_csv(index=False))
    write_text(outputs["md"], to_markdown(reg, table, frame, boot))
    inputs = {}
    for name in referenced_tables(table, reg.params):
        inputs[f"table:{name}"] = paths.table(name, "provenance.json")
        for path in sorted({c["eval_file"] for c in read_json(paths.table(name, "provenance.json"))["cells"]
                            if c.get("eval_file")}):
            inputs[f"evaluation:{path}"] = path
    record = provenance.record("effects", inputs=inputs, wall_time_s=time.time() - started,
                               params={"profile": reg.profile_name, "bootstrap": vars(boot.settings),
                                       "contrasts": definitions().get("contrasts", {}).get(table, {})},
                               extra={"table": table,
                                      "outputs": {str(p): provenance.file_sha256(p) for p in outputs.values()}})
    record_path = effects_path(table, "provenance.json")
    write_json(record_path, record)
    return [*outputs.values(), record_path]
