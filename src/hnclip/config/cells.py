"""How a table cell is named, for everything that reads or writes cells (tables, lineage, effects):
row settings compared by value, column keys, direction labels and the paper's average markers."""
from __future__ import annotations

DIRECTION_LABELS = {"t2i": "T→I", "i2t": "I→T"}
AVG = ("all", "both", "avg")   # the benchmark / direction / metric of a table's average column


def column_key(benchmark: str, direction: str, metric: str) -> str:
    return f"{benchmark}/{direction}/{metric}"


def canonical_row(row: str) -> str:
    """`gamma=1.0` and `gamma=1` name the same row: compare settings by value, not spelling."""
    knob, _, value = row.partition("=")
    try:
        return f"{knob}={float(value):g}"
    except ValueError:
        return row
