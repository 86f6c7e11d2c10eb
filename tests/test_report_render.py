"""Table rendering (hnclip.report.render, tables, build): the one Markdown renderer and LaTeX writer, the
paper's summary cells computed the paper's way (checked against the paper's own numbers), method labels
instead of internal keys, the paper's bands and grouped headers, and Table A3's LaTeX."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from hnclip.config import cells
from hnclip.config.registry import Registry
from hnclip.report import build, tables
from hnclip.report.paper_reference import paper_table, table_meta, table_names
from hnclip.report.render import (
    PORTRAIT_WIDTH_PT,
    Band,
    Block,
    Cell,
    Column,
    latex_escape,
    latex_tabular,
    markdown_blocks,
    natural_width_pt,
)

ROUNDING = 0.01 + 1e-9  # the paper's summaries are computed from unrounded cells, then rounded
SUMMARIES = ("avg", "max_abs_delta", "delta_avg_r1", "best_epoch")


# ---- the one renderer ----------------------------------------------------------------------------

def test_latex_escape_covers_every_special_character_in_one_pass():
    assert latex_escape(r"a\b{c}") == r"a\textbackslash{}b\{c\}"  # the backslash's braces are not re-escaped
    assert latex_escape("R&D 50% #1 $5 x_1 ~ ^") == \
        r"R\&D 50\% \#1 \$5 x\_1 \textasciitilde{} \textasciicircum{}"
    assert latex_escape("T→I ± Δ γ = 0.5 ≈ 16 — max|Δ| − –") == \
        r"T$\to$I $\pm$ $\Delta$ $\gamma$ = 0.5 $\approx$ 16 --- max$|$$\Delta$$|$ - --"


def test_markdown_escapes_pipes_and_spans_and_bolds():
    band = Band([Column("R@1", ("DOCCI", "T→I")), Column("R@5", ("DOCCI", "T→I")), Column("max|Δ|")],
                [Block("Title", [("a|b", [Cell("1.00", bold=True), Cell("2.00"), Cell("3.00")]),
                                 ("epoch", [Cell("6 / 5", span=2), Cell("")])])])
    assert markdown_blocks("Method", band) == [
        "**Title**", "",
        r"| Method | DOCCI T→I R@1 | DOCCI T→I R@5 | max\|Δ\| |", "|---|---|---|---|",
        r"| a\|b | **1.00** | 2.00 | 3.00 |", "| epoch | 6 / 5 |  |  |", ""]


def test_latex_groups_headers_with_multicolumn_and_cmidrule():
    columns = [Column(m, ("DOCCI", d)) for d in ("T→I", "I→T") for m in ("R@1", "R@5")] + [Column("Avg")]
    band = Band(columns, [Block("Paper", [("HN-CLIP", [Cell("88.25", bold=True)] + [Cell("1.00")] * 4)]),
                          Block(None, [("best epoch", [Cell("6 / 5", span=4)])])])
    assert latex_tabular("Method", [band], size="small", colsep_pt=5) == [
        "% page: portrait", r"{\small\setlength{\tabcolsep}{5pt}%", r"\begin{tabular}{lrrrrr}", r"\toprule",
        r" & \multicolumn{4}{c}{DOCCI} &  \\", r"\cmidrule(lr){2-5}",
        r" & \multicolumn{2}{c}{T$\to$I} & \multicolumn{2}{c}{I$\to$T} &  \\", r"\cmidrule(lr){2-3} \cmidrule(lr){4-5}",
        r"Method & R@1 & R@5 & R@1 & R@5 & Avg \\",
        r"\midrule", r"\multicolumn{6}{l}{\emph{Paper}} \\", r"HN-CLIP & \textbf{88.25} & 1.00 & 1.00 & 1.00 & 1.00 \\",
        r"\midrule", r"best epoch & \multicolumn{4}{c}{6 / 5} &  \\",
        r"\bottomrule", r"\end{tabular}}"]


def test_latex_names_the_page_its_table_fits():
    """Portrait A4 (481 pt of text) while the estimated width fits, landscape beyond."""
    def band(n_columns: int, label: str = "HN-CLIP") -> Band:
        return Band([Column("R@10")] * n_columns, [Block(None, [(label, [Cell("-88.25")] * n_columns)])])
    assert latex_tabular("Method", [band(12)])[0] == "% page: portrait"
    assert latex_tabular("Method", [band(20)])[0] == "% page: landscape"
    assert latex_tabular("Method", [band(12, "StructXLIP (chunks aligned) + L_HN" * 2)])[0] == "% page: landscape"
    narrow = natural_width_pt("Method", [band(12)], em_pt=8.0, colsep_pt=3.0)
    assert narrow < natural_width_pt("Method", [band(13)], em_pt=8.0, colsep_pt=3.0) < PORTRAIT_WIDTH_PT


def test_latex_repeats_the_header_in_each_band():
    bands = [Band([Column("R@1", (bench,))], [Block(None, [("x", [Cell("1")])])]) for bench in ("DOCCI", "DCI")]
    lines = latex_tabular("Method", bands)
    assert lines.count(r"\toprule") == 1 and lines.count(r"\bottomrule") == 1
    assert lines.index(r" & \multicolumn{1}{c}{DOCCI} \\") < lines.index(r" & \multicolumn{1}{c}{DCI} \\")
    assert lines.count(r"Method & R@1 \\") == 2


# ---- summary cells, the paper's way --------------------------------------------------------------

def test_summary_rules_default_to_the_papers():
    assert tables.summary_rules("table3b", {"average_column": True}) == {"avg": "mean_r1"}
    assert tables.summary_rules("table3b", {}) == {}  # params.yaml's average_column switches the Avg
    assert tables.summary_rules("tableA2", {}) == {"best_epoch": "selected_epoch"}
    assert tables.summary_rules("tableA8", {}) == {"max_abs_delta": "max_abs_diff_vs"}
    assert tables.summary_rules("tableA9", {}) == {"delta_avg_r1": "mean_r1_diff_vs"}
    assert tables.summary_rules("not_in_the_paper", {"average_column": True}) == {"avg": "mean_r1"}
    assert tables.partners("tableA8") == {"hn_clip/seed=43": "hn_clip/seed=42", "goal/seed=43": "goal/seed=42",
                                         "structxlip/seed=43": "structxlip/seed=42"}


@pytest.mark.parametrize("table", [t for t in table_names() if table_meta(t).get("derived_columns")])
def test_summary_rules_reproduce_every_printed_summary_from_the_papers_own_cells(table):
    """Table 3a/3b/3c Avg, A8 max|Δ| and A9 Δ avg R@1, recomputed from the paper's printed cells."""
    paper = paper_table(table)
    recall = paper[paper["metric"].str.startswith("R@")].assign(seed=42)
    rules = tables.summary_rules(table, {"average_column": "avg" in table_meta(table)["derived_columns"]})
    computed = pd.concat([tables.seed_summaries(recall, rules),
                          tables.paired_summaries(recall, rules, tables.partners(table))], ignore_index=True)
    printed = paper[paper["metric"].isin(SUMMARIES)]
    both = printed.merge(computed, on=tables.KEYS, suffixes=("_paper", "_ours"))
    assert len(both) == len(printed) > 0
    assert (both["value_paper"] - both["value_ours"]).abs().max() <= ROUNDING


def test_table3b_avg_is_the_mean_of_the_four_r1_cells():
    paper = paper_table("table3b")
    row = paper[paper["row"] == "tok=0,hn=0"].assign(seed=42)
    avg = tables.seed_summaries(row[row["metric"] != "avg"], {"avg": "mean_r1"})["value"].item()
    assert avg == pytest.approx((79.39 + 78.34 + 70.24 + 68.44) / 4)
    assert round(avg, 2) == 74.10


# ---- end to end: records carrying the paper's numbers give the paper's summaries ------------------

def _paper_valued_project(params: dict, table: str, root: Path) -> Registry:
    """A project whose evaluation records hold the paper's cells of `table` (and its best epochs)."""
    reg = Registry({**params, "profile": "paper"}, validate=False)  # the schema needs the project as cwd
    paper = paper_table(table)
    values = {(cells.canonical_row(r), b, d, m): v for r, b, d, m, v in
              zip(paper["row"], paper["benchmark"], paper["direction"], paper["metric"], paper["value"])}
    for cell in reg.cells(table):
        if not cell.run_id:
            continue
        row = cells.canonical_row(cell.row)
        metrics = {d: {f"R@{k}": values.get((row, cell.benchmark, d, f"R@{k}"), 0.0) for k in (1, 5, 10, 25, 50)}
                   for d in ("t2i", "i2t")}
        epoch = values.get((row, cell.benchmark, "both", "best_epoch"), 1)
        path = root / "results" / "evals" / cell.run_id / f"{cell.benchmark}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"best": {"epoch": epoch, "metrics": metrics}}))
    return reg


@pytest.mark.parametrize("table", ["table3a", "table3b", "table3c", "tableA2", "tableA8", "tableA9"])
def test_reproducing_the_papers_cells_reproduces_its_summary_cells(params, table, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    reg = _paper_valued_project(params, table, tmp_path)
    frame = tables.aggregate(reg, table, tables.collect(reg, table))
    summaries = frame[frame["metric"].isin(SUMMARIES) & frame["paper"].notna()]
    assert len(summaries) == len(paper_table(table).query("metric in @SUMMARIES")) > 0
    assert (summaries["status"] == "ok").all()
    assert (summaries["ours_mean"] - summaries["paper"]).abs().max() <= ROUNDING


def test_a2_prints_the_best_epoch_row_in_each_band(params, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    reg = _paper_valued_project(params, "tableA2", tmp_path)
    frame = tables.aggregate(reg, "tableA2", tables.collect(reg, "tableA2"))
    markdown = tables.to_markdown(reg, "tableA2", frame)
    epoch_rows = [line for line in markdown.splitlines() if line.startswith("| best epoch (rows in order) |")]
    spans = [cell for epochs in ("6 / 5", "5 / 1", "10 / 10", "4 / 1") for cell in [epochs] + [""] * 5]
    assert epoch_rows == ["| best epoch (rows in order) | " + " | ".join(spans) + " |"] * 2  # reproduced, then paper
    latex = tables.to_latex(reg, "tableA2", frame)
    assert latex.count(r"\multicolumn{6}{c}{6 / 5} & \multicolumn{6}{c}{5 / 1} \\") == 2
    assert latex.count(r"\multicolumn{6}{c}{10 / 10} & \multicolumn{6}{c}{4 / 1} \\") == 2
    # The paper's bands: DOCCI and DCI above, Long-DCI and Urban-1K below.
    assert latex.index(r"\multicolumn{6}{c}{DCI}") < latex.index(r"\multicolumn{6}{c}{Long-DCI}")
    assert r"\multicolumn{6}{c}{Long-DCI} & \multicolumn{6}{c}{Urban-1K}" in latex


def test_a8_and_a9_show_their_comparison_columns(params, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    reg = _paper_valued_project(params, "tableA8", tmp_path)
    frame = tables.aggregate(reg, "tableA8", tables.collect(reg, "tableA8"))
    markdown = tables.to_markdown(reg, "tableA8", frame)
    hn_clip = params["methods"]["hn_clip"]["label"]
    assert r"| max\|Δ\| |" in markdown.splitlines()[6]
    assert f"| {hn_clip}, seed 43 | 78.79 | 92.32 | 95.12 | 76.18 | 91.99 | 95.15 | 1.44 |" in markdown
    assert f"| {hn_clip}, seed 42 | **79.03** |" in markdown  # no max|Δ| on the seed-42 row
    reg = _paper_valued_project(params, "tableA9", tmp_path)
    frame = tables.aggregate(reg, "tableA9", tables.collect(reg, "tableA9"))
    cell = frame[(frame["row"] == "docci/20%/hn_clip") & (frame["metric"] == "delta_avg_r1")].iloc[0]
    assert cell["ours_mean"] == pytest.approx((85.43 + 83.75) / 2 - (78.22 + 76.47) / 2)
    assert cell["benchmark"] == "docci" and not cell["best_ours"]


# ---- labels --------------------------------------------------------------------------------------

def test_rows_show_method_labels_and_what_the_row_changes(params):
    reg = Registry({**params, "profile": "paper"}, validate=False)
    label = {m: params["methods"][m]["label"] for m in ("hn_clip", "goal", "zeroshot")}
    assert tables.row_labels(reg, "table3a")["gamma=0.5"] == "γ = 0.5"
    assert tables.row_labels(reg, "table1")["longclip_zeroshot"] == label["zeroshot"]
    assert tables.row_labels(reg, "tableA7")["hn_clip"] == f"{label['hn_clip']}, trained on DOCCI"
    assert tables.row_labels(reg, "tableA8")["hn_clip/seed=43"] == f"{label['hn_clip']}, seed 43"
    assert tables.row_labels(reg, "tableA9")["docci/5%/goal"] == f"{label['goal']}, DOCCI, 5% data"
    assert tables.row_labels(reg, "tableA10")["dci->docci/hn_clip"] == f"{label['hn_clip']}, DCI → DOCCI"
    assert tables.row_labels(reg, "tableA10")["dci->dci/longclip"] == f"{label['zeroshot']}, DCI"


def test_csv_keeps_the_key_and_gains_the_label_and_one_seed_reads_seed_42(params, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    reg = _paper_valued_project(params, "table3a", tmp_path)
    frame = tables.aggregate(reg, "table3a", tables.collect(reg, "table3a"))
    assert list(frame.columns[:4]) == ["table", "row", "label", "benchmark"]
    assert dict(zip(frame["row"], frame["label"]))["gamma=0.25"] == "γ = 0.25"
    markdown = tables.to_markdown(reg, "table3a", frame)
    assert "**Reproduced (paper profile, seed 42; best epoch)**" in markdown and "[42]" not in markdown
    assert "| γ = 0.25 | 87.82 | **86.63** |" in markdown and "gamma=" not in markdown
    assert r"$\gamma$ = 0.25 & 87.82 & \textbf{86.63} &" in tables.to_latex(reg, "table3a", frame)


# ---- Table A3 ------------------------------------------------------------------------------------

def test_timing_table_writes_latex_with_the_papers_printed_cells(params, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    reg = Registry({**params, "profile": "paper"}, validate=False)
    for run_id in filter(None, reg.timed_runs().values()):
        path = tmp_path / "results" / "runs" / run_id / "train.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"wall_time_s": 1234.5, "images_per_second": 44.25, "device": {"type": "cpu"}}))
    outputs = build.build_timing_table(reg)
    assert [p.suffix for p in outputs] == [".csv", ".md", ".tex", ".json"]
    latex, markdown = outputs[2].read_text(), outputs[1].read_text()
    goal = params["methods"]["goal"]["label"]
    assert (rf"{latex_escape(goal)} & SAM segments & required & 20.57 & 44.25 & 0.00 & cpu & "
            rf"$\approx$ 41 & $\approx$ 22 \\") in latex
    assert f"| {goal} | SAM segments | required | 20.57 | 44.25 | 0.00 | cpu | ≈ 41 | ≈ 22 |" in markdown
    assert "| — | — |" in markdown  # FineLIP's wall-clock is not reported in the paper
    csv = pd.read_csv(outputs[0])
    assert {"row", "label"} <= set(csv.columns) and set(csv["label"]) >= {goal}
    assert not math.isnan(csv.loc[csv["row"] == "goal", "ours"].iloc[0])
