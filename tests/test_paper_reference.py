"""The transcription of the paper's result tables (src/hnclip/report/paper_tables.yaml) is faithful.

Every check iterates over the tables and over the YAML's own rules, so adding a table means adding data:
  * shape: each table has the printed number of rows, columns and Δ rows;
  * plausibility: canonical keys, recalls within [0, 100] and non-decreasing in K;
  * stated Δ rows and summary columns (Avg, max|Δ|, Δ avg R@1) agree with the cells they summarise;
  * cross-table identities the paper implies hold;
  * the paper's own disagreements are exactly the YAML's ``known_inconsistencies`` (cell by cell), so a
    transcription error anywhere in a checked cell still fails;
  * when the paper's text extraction is available, every transcribed row occurs verbatim in its table.
"""
from __future__ import annotations

import math
import os
import re
from collections import defaultdict
from importlib import resources
from pathlib import Path

import pandas as pd
import pytest

from hnclip.report import paper_reference as ref

# (measured rows, columns, Δ rows) as printed; Table 3's three panels are separate tables.
EXPECTED_SHAPES = {
    "table1": (5, 24, 1),
    "table2": (12, 12, 6),
    "table3a": (5, 9, 0),
    "table3b": (4, 13, 0),
    "table3c": (2, 9, 1),
    "tableA1": (4, 5, 0),
    "tableA2": (2, 24, 1),
    "tableA3": (5, 2, 0),
    "tableA4": (12, 24, 6),
    "tableA5": (4, 40, 0),
    "tableA6": (5, 40, 0),
    "tableA7": (5, 10, 0),
    "tableA8": (6, 7, 0),
    "tableA9": (16, 11, 0),
    "tableA10": (20, 6, 0),
}
SUMMARY_METRICS = {"avg", "max_abs_delta", "delta_avg_r1", "best_epoch"}
STAT_METRICS = {"n_train", "n_test", "words", "pairwise_sim", "hardest_sim", "wall_clock_min", "throughput_img_s"}
EXACT = 0.005           # a difference of two 2-decimal numbers is exact: any error is >= 0.01
ROUNDING = 0.01 + 1e-9  # values computed from averages of rounded cells ("to rounding ±0.01")
EXPLANATIONS = {"dagger", "display_rule", "unexplained"}
PAPER_TEXT = Path(os.environ.get("HNCLIP_PAPER_TEXT", "/work/shared/paper/hn-clip-paper.txt"))

TABLES = ref.table_names()


# ---- helpers ------------------------------------------------------------------------------------------

def cell_id(key: tuple[str, str, str]) -> str:
    return "/".join(key)


def row_cells(name: str, row_key: str) -> dict[tuple[str, str, str], tuple[float, str | None]]:
    """(benchmark, direction, metric) -> (value, flag) of one measured or Δ row; blank cells omitted."""
    meta = ref.table_meta(name)
    rows = {row["key"]: row for row in meta["rows"] + meta.get("deltas", [])}
    row = rows[row_key]
    out = {}
    for column, raw in zip(meta["columns"], row["values"]):
        cell = ref.parse_cell(raw)
        if cell is not None:
            out[ref.resolve_column(column, row)] = cell
    return out


def derived_metrics(name: str) -> set[str]:
    return set(ref.table_meta(name).get("derived_columns", {}))


def mean_r1(cells: dict, skip: set[str]) -> float:
    r1 = [value for (_, _, metric), (value, _) in cells.items() if metric == "R@1" and metric not in skip]
    assert r1, "no R@1 cells to average"
    return sum(r1) / len(r1)


def delta_discrepancies(name: str) -> dict[str, set]:
    """Δ rows vs. their rule (delta:<t>) and vs. the "≈ 0" display rule (approx_zero_rule:<t>)."""
    meta = ref.table_meta(name)
    found = defaultdict(set)
    threshold = meta.get("approx_zero_max")
    for delta in meta.get("deltas", []):
        rule = delta["rule"]
        a = row_cells(name, rule["a"])
        subtrahends = [row_cells(name, key) for key in rule.get("b_max_of", [rule.get("b")])]
        for key, (stated, flag) in row_cells(name, delta["key"]).items():
            computed = round(a[key][0] - max(cells[key][0] for cells in subtrahends), 6)
            if flag == ref.APPROX_ZERO:
                assert threshold is not None, f"{name} {delta['key']}: '≈ 0' without a display rule"
                if abs(computed) > threshold:
                    found[f"approx_zero_rule:{name}"].add((delta["key"], cell_id(key)))
                continue
            assert flag is None, f"{name} {delta['key']} {key}: unexpected flag {flag}"
            tol = ROUNDING if key[2] in derived_metrics(name) else EXACT
            if abs(stated - computed) > tol:
                found[f"delta:{name}"].add((delta["key"], cell_id(key)))
            if threshold is not None and abs(computed) <= threshold:
                found[f"approx_zero_rule:{name}"].add((delta["key"], cell_id(key)))
    return found


def derived_discrepancies(name: str) -> dict[str, set]:
    """Summary columns (Avg, max|Δ|, Δ avg R@1) vs. the cells they summarise (derived:<t>)."""
    meta = ref.table_meta(name)
    rules = meta.get("derived_columns", {})
    found = defaultdict(set)
    for row in meta["rows"]:
        cells = row_cells(name, row["key"])
        plain = {key: value for key, value in cells.items() if key[2] not in rules}
        for key, (stated, _) in cells.items():
            rule = rules.get(key[2])
            if rule is None:
                continue
            if rule == "mean_r1":
                computed, tol = mean_r1(plain, set()), ROUNDING
            elif rule == "max_abs_diff_vs":
                other = row_cells(name, row["vs"])
                computed, tol = max(abs(value - other[k][0]) for k, (value, _) in plain.items()), EXACT
            elif rule == "mean_r1_diff_vs":
                other = {k: v for k, v in row_cells(name, row["vs"]).items() if k[2] not in rules}
                computed, tol = mean_r1(plain, set()) - mean_r1(other, set()), ROUNDING
            else:
                raise AssertionError(f"{name}: unknown derived rule {rule!r}")
            if abs(stated - computed) > tol:
                found[f"derived:{name}"].add((row["key"], cell_id(key)))
    return found


def identity_discrepancies(identity: dict) -> set:
    left, right = identity["left"], identity["right"]
    benchmarks, metrics = identity.get("benchmarks"), identity.get("metrics")
    found = set()
    for left_row, right_row in identity["rows"].items():
        lcells, rcells = row_cells(left, left_row), row_cells(right, right_row)
        keys = [key for key in lcells if key in rcells
                and (benchmarks is None or key[0] in benchmarks) and (metrics is None or key[2] in metrics)]
        assert keys, f"identity {identity['id']}: {left}.{left_row} and {right}.{right_row} share no cell"
        if identity.get("superset"):
            missing = [key for key in rcells if key[2] not in derived_metrics(right) and key not in lcells]
            assert not missing, f"identity {identity['id']}: {left}.{left_row} lacks {missing}"
        for key in keys:
            lvalue, rvalue = lcells[key][0], rcells[key][0]
            if math.isnan(lvalue) or math.isnan(rvalue):
                continue
            if abs(lvalue - rvalue) > 1e-9:
                found.add((left_row, cell_id(key)))
    return found


def all_checks() -> dict[str, set]:
    """Every check group -> the discrepancies it finds (possibly none)."""
    checks = {}
    for name in TABLES:
        for kind in ("delta", "approx_zero_rule", "derived"):
            checks[f"{kind}:{name}"] = set()
        checks.update(delta_discrepancies(name))
        checks.update(derived_discrepancies(name))
    for identity in ref.identities():
        checks[f"identity:{identity['id']}"] = identity_discrepancies(identity)
    return checks


def known_by_check() -> dict[str, set]:
    known = defaultdict(set)
    for entry in ref.known_inconsistencies():
        for cell in entry["cells"]:
            known[entry["check"]].add((entry["row"], cell))
    return known


CHECKS = all_checks()


# ---- shape and vocabulary -------------------------------------------------------------------------------

def test_table_names_in_paper_order():
    assert TABLES == list(EXPECTED_SHAPES)


@pytest.mark.parametrize("name", TABLES)
def test_shape_matches_paper(name):
    meta = ref.table_meta(name)
    n_rows, n_cols, n_deltas = EXPECTED_SHAPES[name]
    assert (len(meta["rows"]), len(meta["columns"]), len(meta.get("deltas", []))) == (n_rows, n_cols, n_deltas)
    assert all(len(row["values"]) == n_cols for row in meta["rows"] + meta.get("deltas", []))
    bands = meta.get("bands", 1)
    assert n_cols % bands == 0
    # the tidy frame has one row per printed (non-blank) cell
    frame = ref.paper_table(name)
    printed = sum(ref.parse_cell(raw) is not None for row in meta["rows"] for raw in row["values"])
    extra = sum(len(v) for v in meta.get("per_benchmark", {}).get("values", {}).values())
    assert len(frame) == printed + extra
    assert list(frame.columns) == ref.TIDY_COLUMNS
    assert list(dict.fromkeys(frame["row"])) == [row["key"] for row in meta["rows"]]
    deltas = ref.stated_deltas(name)
    assert list(deltas.columns) == ref.TIDY_COLUMNS
    assert len(deltas) == n_deltas * n_cols
    assert all(key.startswith("delta") for key in deltas["row"])


@pytest.mark.parametrize("name", TABLES)
def test_canonical_keys(name):
    meta = ref.table_meta(name)
    assert meta["caption"] and meta["section"] and meta["anchor"]
    both = pd.concat([ref.paper_table(name), ref.stated_deltas(name)], ignore_index=True)
    assert set(both["benchmark"]) <= set(ref.BENCHMARKS) | {"all"}
    assert set(both["direction"]) <= set(ref.DIRECTIONS) | {"both", "none"}
    assert set(both["metric"]) <= set(ref.RECALL_METRICS) | SUMMARY_METRICS | STAT_METRICS
    for row in meta["rows"] + meta.get("deltas", []):
        keys = [ref.resolve_column(column, row) for column in meta["columns"]]
        assert len(set(keys)) == len(keys), f"{name} {row['key']}: duplicate column keys"
        assert set(row) <= {"key", "label", "values", "note", "dagger", "benchmark", "vs", "attributes",
                            "fraction", "train", "rule"}
        assert set(row.get("dagger", [])) <= set(ref.BENCHMARKS)
        assert "†" not in row["label"], "† belongs in the dagger/note fields, not in the label"
    for metric, rule in meta.get("derived_columns", {}).items():
        for row in meta["rows"]:
            value = ref.parse_cell(row["values"][[c[2] for c in meta["columns"]].index(metric)])
            if rule.endswith("_vs"):  # printed exactly on the rows that name a partner
                assert (value is not None) == ("vs" in row), f"{name} {row['key']}: {metric} vs partner"


@pytest.mark.parametrize("name", TABLES)
def test_values_plausible(name):
    frame = ref.paper_table(name)
    recalls = frame[frame["metric"].isin(ref.RECALL_METRICS)]
    assert recalls["value"].between(0, 100).all()
    order = {metric: i for i, metric in enumerate(ref.RECALL_METRICS)}
    for (row, bench, direction), group in recalls.groupby(["row", "benchmark", "direction"], sort=False):
        values = group.assign(k=group["metric"].map(order)).sort_values("k")["value"].tolist()
        assert values == sorted(values), f"{name} {row} {bench} {direction}: recall decreases with K"
    sims = frame[frame["metric"].isin({"pairwise_sim", "hardest_sim"})]
    assert sims["value"].between(0, 1).all()
    flagged = frame[frame["flag"].notna()]
    assert set(flagged["flag"]) <= {ref.APPROX, ref.NOT_REPORTED}


# ---- internal and cross-table consistency ----------------------------------------------------------------

def test_known_inconsistencies_are_well_formed():
    for entry in ref.known_inconsistencies():
        assert entry["check"] in CHECKS, f"known inconsistency names an unknown check {entry['check']!r}"
        assert entry["cells"] and len(set(entry["cells"])) == len(entry["cells"])
        assert entry["explained_by"] in EXPLANATIONS and entry["note"]
    entries = [(e["check"], e["row"]) for e in ref.known_inconsistencies()]
    assert len(set(entries)) == len(entries), "one entry per (check, row)"


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_discrepancies_are_exactly_the_known_ones(check):
    """Stated Δ rows, summary columns and cross-table identities hold except where the YAML says not."""
    found, known = CHECKS[check], known_by_check().get(check, set())
    assert sorted(found - known) == [], f"{check}: unexpected discrepancies (transcription error?)"
    assert sorted(known - found) == [], f"{check}: listed inconsistencies that do not exist"


def test_dagger_explanations_point_at_daggered_cells():
    identities = {identity["id"]: identity for identity in ref.identities()}
    for entry in ref.known_inconsistencies():
        if entry["explained_by"] != "dagger":
            continue
        kind, _, check_id = entry["check"].partition(":")
        assert kind == "identity", "only identity mismatches can be explained by †"
        identity = identities[check_id]
        sides = [(identity["left"], entry["row"]), (identity["right"], identity["rows"][entry["row"]])]
        daggered = set()
        for name, row_key in sides:
            row = next(r for r in ref.table_meta(name)["rows"] if r["key"] == row_key)
            daggered |= set(row.get("dagger", []))
        for cell in entry["cells"]:
            assert cell.split("/")[0] in daggered, f"{entry['check']} {entry['row']} {cell}: no † on either side"


def test_every_table_takes_part_in_a_check():
    """Tables with numbers that can be cross-checked appear in at least one identity or rule."""
    involved = {i["left"] for i in ref.identities()} | {i["right"] for i in ref.identities()}
    involved |= {name for name in TABLES if ref.table_meta(name).get("deltas")
                 or ref.table_meta(name).get("derived_columns")}
    assert set(TABLES) - involved == {"tableA1", "tableA3"}


# ---- verbatim check against the paper's text extraction ------------------------------------------------

TOKEN = re.compile(r"([↑↓])\s*(\d+(?:\.\d+)?)|≈\s*(\d+(?:\.\d+)?)|(—)|(\d+(?:\.\d+)?)")


def tokens(text: str) -> list[tuple]:
    out = []
    for m in TOKEN.finditer(text):
        if m[1]:
            out.append(("num", round(float(m[2]) * (1 if m[1] == "↑" else -1), 6)))
        elif m[3] is not None:
            out.append(("approx_zero",) if float(m[3]) == 0 else ("approx", round(float(m[3]), 6)))
        elif m[4]:
            out.append(("dash",))
        else:
            out.append(("num", round(float(m[5]), 6)))
    return out


def expected_token(raw) -> tuple | None:
    cell = ref.parse_cell(raw)
    if cell is None:
        return None
    value, flag = cell
    return {None: ("num", round(value, 6)), ref.APPROX: ("approx", round(value, 6)),
            ref.APPROX_ZERO: ("approx_zero",), ref.NOT_REPORTED: ("dash",)}[flag]


def find_run(stream: list, run: list, start: int) -> int:
    for i in range(start, len(stream) - len(run) + 1):
        if stream[i:i + len(run)] == run:
            return i
    return -1


@pytest.fixture(scope="module")
def paper_text():
    if not PAPER_TEXT.is_file():
        pytest.skip(f"paper text extraction not available at {PAPER_TEXT} (set HNCLIP_PAPER_TEXT)")
    return PAPER_TEXT.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", TABLES)
def test_rows_occur_verbatim_in_paper(name, paper_text):
    meta = ref.table_meta(name)
    anchors = sorted({ref.table_meta(t)["anchor"] for t in TABLES}, key=paper_text.find)
    assert paper_text.count(meta["anchor"]) == 1
    start = paper_text.find(meta["anchor"])
    later = [paper_text.find(a) for a in anchors if paper_text.find(a) > start]
    stream = tokens(paper_text[start:min(later, default=len(paper_text))])
    bands = meta.get("bands", 1)
    width = len(meta["columns"]) // bands
    for band in range(bands):
        span = slice(band * width, (band + 1) * width)
        for rows in (meta["rows"], meta.get("deltas", [])):
            position = 0
            for row in rows:  # in printed order within the band
                run = [t for t in map(expected_token, row["values"][span]) if t is not None]
                found = find_run(stream, run, position)
                assert found >= 0, f"{name} {row['key']} band {band + 1}: {run} not in the paper's table"
                position = found + len(run)
        extra = meta.get("per_benchmark")
        if extra:  # e.g. "best epoch (default / frozen) 6 / 5 5 / 1", per benchmark of the band
            benches = list(dict.fromkeys(c[0] for c in meta["columns"][span]))
            run = [("num", float(extra["values"][row][bench])) for bench in benches for row in extra["values"]]
            assert find_run(stream, run, 0) >= 0, f"{name} per-benchmark {extra['metric']} band {band + 1}"


# ---- API ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, expected", [
    (("table1", "hn_clip", "urban1k", "i2t", "R@10"), 99.30),
    (("table3a", "gamma=0.5", "docci", "t2i", "R@1"), 88.25),
    (("table3a", "gamma=1.0", "all", "both", "avg"), 83.04),
    (("table3c", "delta", "long_dci", "t2i", "R@1"), -0.90),
    (("tableA1", "long_dci", "long_dci", "none", "n_test"), 7444),
    (("tableA2", "frozen", "dci", "both", "best_epoch"), 1),
    (("tableA3", "goal", "dci", "none", "wall_clock_min"), 41),
    (("tableA8", "goal/seed=43", "long_dci", "both", "max_abs_delta"), 1.28),
    (("tableA9", "dci/20%/hn_clip", "dci", "both", "delta_avg_r1"), 4.90),
    (("tableA10", "docci->dci/hn_clip", "dci", "i2t", "R@1"), 75.64),
])
def test_paper_value(args, expected):
    assert ref.paper_value(*args) == pytest.approx(expected)


def test_paper_value_flags():
    assert math.isnan(ref.paper_value("tableA4", "delta:longclip_ft", "docci", "t2i", "R@10"))
    deltas = ref.stated_deltas("tableA4")
    assert set(deltas.loc[deltas["value"].isna(), "flag"]) == {ref.APPROX_ZERO}
    assert math.isnan(ref.paper_value("tableA3", "finelip", "dci", "none", "throughput_img_s"))
    frame = ref.paper_table("tableA5")
    assert frame.loc[frame["row"] == "tok=1,hn=1"].groupby("benchmark")["dagger"].all().to_dict() == \
        {"docci": False, "dci": False, "long_dci": True, "urban1k": True}


@pytest.mark.parametrize("call, allowed", [
    (lambda: ref.paper_table("table4"), "table1"),
    (lambda: ref.stated_deltas("tableA3x"), "tableA10"),
    (lambda: ref.paper_value("table3a", "gamma=2", "docci", "t2i", "R@1"), "gamma=0.25"),
    (lambda: ref.paper_value("table3a", "gamma=0", "docci", "t2i", "R@5"), "(docci, t2i, R@1)"),
])
def test_unknown_keys_raise_keyerror_naming_allowed_values(call, allowed):
    with pytest.raises(KeyError, match=re.escape(allowed)):
        call()


def test_yaml_is_package_data():
    assert resources.files("hnclip.report").joinpath("paper_tables.yaml").is_file()
