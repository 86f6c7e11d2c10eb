"""The paper's result tables as data: a loader for ``paper_tables.yaml``.

Every number of every result table of the HN-CLIP paper is transcribed in ``paper_tables.yaml`` (package
data, next to this module). This module turns it into tidy frames, one row per printed cell::

    table, row, label, benchmark, direction, metric, value, flag, dagger

``benchmark`` is one of docci / dci / long_dci / urban1k (``all`` for a summary across benchmarks),
``direction`` t2i / i2t (``both`` for a summary over the two, ``none`` where directions do not apply),
``metric`` R@1 ... R@50 or a summary metric (avg, max_abs_delta, delta_avg_r1, ...). ``flag`` marks cells
the paper does not print as a plain number: ``approx_zero`` (printed "≈ 0", value NaN), ``approx``
(printed "≈ x"), ``not_reported`` (printed "—", value NaN). ``dagger`` is True where the paper marks the
cell's row (band) with † (checkpoint re-evaluated from a replica or the seed-43 run).

Δ rows are kept apart from the measured rows: ``paper_table`` returns the measured cells, ``stated_deltas``
the Δ rows exactly as printed (row keys ``delta`` or ``delta:<baseline row>``).
"""
from __future__ import annotations

import copy
import functools
import math
from typing import Any

import pandas as pd

from hnclip.config.params import read_yaml
from hnclip.io import package_text

DATA_FILE = "paper_tables.yaml"
TIDY_COLUMNS = ["table", "row", "label", "benchmark", "direction", "metric", "value", "flag", "dagger"]
BENCHMARKS = ("docci", "dci", "long_dci", "urban1k")
DIRECTIONS = ("t2i", "i2t")
RECALL_METRICS = ("R@1", "R@5", "R@10", "R@25", "R@50")

# How a printed cell that is not a plain number is stored: marker -> (value, flag).
APPROX_ZERO, APPROX, NOT_REPORTED = "approx_zero", "approx", "not_reported"


def _read_text() -> str:
    return package_text(__package__, DATA_FILE)


@functools.lru_cache(maxsize=1)
def _spec() -> dict[str, Any]:
    spec = read_yaml(_read_text())  # libyaml's loader: every report job reads this file
    for name, table in spec["tables"].items():
        _validate(name, table)
    return spec


def _validate(name: str, table: dict) -> None:
    ncols = len(table["columns"])
    for row in table["rows"] + table.get("deltas", []):
        if len(row["values"]) != ncols:
            raise ValueError(f"{DATA_FILE}: {name} row {row['key']!r} has {len(row['values'])} values "
                             f"for {ncols} columns")
    keys = [row["key"] for row in table["rows"] + table.get("deltas", [])]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{DATA_FILE}: {name} has duplicate row keys")


def parse_cell(raw: Any) -> tuple[float, str | None] | None:
    """A YAML cell -> (value, flag); None for a cell the paper leaves blank."""
    if raw is None:
        return None
    if isinstance(raw, bool):
        raise ValueError(f"boolean cell {raw!r}")
    if isinstance(raw, (int, float)):
        return float(raw), None
    text = str(raw).strip()
    if text == "—":
        return math.nan, NOT_REPORTED
    if text.startswith("≈"):
        number = float(text[1:])
        return (math.nan, APPROX_ZERO) if number == 0 else (number, APPROX)
    raise ValueError(f"unrecognised cell {raw!r}")


def _check_name(name: str) -> dict:
    tables = _spec()["tables"]
    if name not in tables:
        raise KeyError(f"unknown paper table {name!r}; allowed: {', '.join(tables)}")
    return tables[name]


def table_names() -> list[str]:
    """The transcribed tables in paper order: table1, table2, table3a, ..., tableA10."""
    return list(_spec()["tables"])


def table_meta(name: str) -> dict[str, Any]:
    """A deep copy of the table's YAML entry (caption, section, columns, rows, deltas, notes, ...)."""
    return copy.deepcopy(_check_name(name))


def identities() -> list[dict[str, Any]]:
    """Cross-table identities the paper implies (see the YAML's ``identities``)."""
    return copy.deepcopy(_spec()["identities"])


def known_inconsistencies() -> list[dict[str, Any]]:
    """Disagreements inside the paper itself, cell by cell (see the YAML's ``known_inconsistencies``)."""
    return copy.deepcopy(_spec()["known_inconsistencies"])


def resolve_column(column: list, row: dict) -> tuple[str, str, str]:
    """A column spec [benchmark, direction, metric] for a given row; a null benchmark is the row's."""
    benchmark, direction, metric = column
    if benchmark is None:
        benchmark = row["benchmark"]
    return benchmark, direction, metric


def _dagger(row: dict, benchmark: str) -> bool:
    marked = row.get("dagger") or []
    return marked == "all" or benchmark in marked


def _tidy(name: str, rows: list[dict], table: dict) -> pd.DataFrame:
    records = []
    for row in rows:
        for column, raw in zip(table["columns"], row["values"]):
            cell = parse_cell(raw)
            if cell is None:
                continue
            benchmark, direction, metric = resolve_column(column, row)
            records.append((name, row["key"], row["label"], benchmark, direction, metric, cell[0], cell[1],
                            _dagger(row, benchmark)))
    return pd.DataFrame.from_records(records, columns=TIDY_COLUMNS)


def _per_benchmark(name: str, table: dict) -> pd.DataFrame:
    extra = table.get("per_benchmark")
    if not extra:
        return pd.DataFrame(columns=TIDY_COLUMNS)
    labels = {row["key"]: row["label"] for row in table["rows"]}
    rows = {row["key"]: row for row in table["rows"]}
    records = [(name, key, labels[key], bench, extra["direction"], extra["metric"], float(value), None,
                _dagger(rows[key], bench))
               for key, per_bench in extra["values"].items() for bench, value in per_bench.items()]
    return pd.DataFrame.from_records(records, columns=TIDY_COLUMNS)


def paper_table(name: str) -> pd.DataFrame:
    """The table's printed cells (Δ rows excluded), tidy: one row per cell, in printed order.

    Columns: table, row, label, benchmark, direction, metric, value, flag, dagger. Summary columns
    (e.g. Table 3a's Avg) are cells with benchmark="all", direction="both", metric="avg"; blank cells are
    omitted; Table A2's per-benchmark best epochs are cells with direction="both", metric="best_epoch".
    """
    table = _check_name(name)
    frames = [_tidy(name, table["rows"], table), _per_benchmark(name, table)]
    frames = [frame for frame in frames if not frame.empty]
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def stated_deltas(name: str) -> pd.DataFrame:
    """The table's Δ rows exactly as printed (same tidy shape; row keys ``delta`` / ``delta:<baseline>``).

    A Δ printed "≈ 0" has value NaN and flag ``approx_zero``. Empty for tables that print no Δ row.
    """
    table = _check_name(name)
    return _tidy(name, table.get("deltas", []), table)


def paper_value(name: str, row: str, benchmark: str, direction: str, metric: str) -> float:
    """One printed number (measured rows and Δ rows alike); NaN for a cell printed "≈ 0" or "—"."""
    cells = pd.concat([paper_table(name), stated_deltas(name)], ignore_index=True)
    rows = list(dict.fromkeys(cells["row"]))
    if row not in rows:
        raise KeyError(f"paper table {name!r} has no row {row!r}; allowed: {', '.join(rows)}")
    in_row = cells[cells["row"] == row]
    hit = in_row[(in_row["benchmark"] == benchmark) & (in_row["direction"] == direction)
                 & (in_row["metric"] == metric)]
    if hit.empty:
        allowed = ", ".join(f"({b}, {d}, {m})" for b, d, m in
                            zip(in_row["benchmark"], in_row["direction"], in_row["metric"]))
        raise KeyError(f"paper table {name!r} row {row!r} has no cell ({benchmark}, {direction}, {metric}); "
                       f"allowed: {allowed}")
    return float(hit["value"].iloc[0])
