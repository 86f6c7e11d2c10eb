"""Paper tables from evaluation records: reproduced value (mean and spread over seeds), the
paper's value and the delta, as tidy CSV, Markdown and LaTeX."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from hnclip.config import paths
from hnclip.config.registry import NOT_IMPLEMENTED, Registry
from hnclip.io import read_json

DIRECTION_LABELS = {"t2i": "T→I", "i2t": "I→T"}
DIRECTION_LATEX = {"t2i": r"T$\to$I", "i2t": r"I$\to$T"}
AVG = ("all", "both", "avg")


def column_key(benchmark: str, direction: str, metric: str) -> str:
    return f"{benchmark}/{direction}/{metric}"


def collect(reg: Registry, table: str) -> pd.DataFrame:
    """One row per (cell, seed): the selected epoch's value read from the evaluation record, or
    NaN with status "not implemented yet" for rows whose framework this pipeline does not train."""
    spec = reg.params["tables"][table]
    selection = spec["selection"]
    rows = []
    for cell in reg.cells(table):
        chosen, path = None, None
        if cell.run_id:
            path = paths.evaluation(cell.run_id, cell.benchmark)
            chosen = read_json(path)[selection]
        for direction in spec["directions"]:
            for metric in spec["metrics"]:
                rows.append({"table": table, "row": cell.row, "benchmark": cell.benchmark,
                             "direction": direction, "metric": metric, "seed": cell.seed, "status": cell.status,
                             "run_id": cell.run_id, "epoch": chosen["epoch"] if chosen else None,
                             "eval_file": str(path) if path else None,
                             "value": chosen["metrics"][direction][metric] if chosen else math.nan})
    return pd.DataFrame(rows)


def canonical_row(row: str) -> str:
    """`gamma=1.0` and `gamma=1` name the same row: compare settings by value, not spelling."""
    knob, _, value = row.partition("=")
    try:
        return f"{knob}={float(value):g}"
    except ValueError:
        return row


def _paper_values(table: str) -> pd.DataFrame | None:
    from hnclip.report.paper_reference import paper_table, table_names
    if table not in table_names():
        return None
    paper = paper_table(table)
    return paper.assign(row=paper["row"].map(canonical_row))


def aggregate(reg: Registry, table: str, per_seed: pd.DataFrame) -> pd.DataFrame:
    spec = reg.params["tables"][table]
    keys = ["row", "benchmark", "direction", "metric"]
    frames = [per_seed]
    if spec.get("average_column"):
        avg = per_seed.groupby(["row", "seed"], sort=False, as_index=False)["value"].mean()
        avg["benchmark"], avg["direction"], avg["metric"] = AVG
        frames.append(avg)
    both = pd.concat(frames, ignore_index=True)
    grouped = both.groupby(keys, sort=False)["value"]
    out = grouped.agg(ours_mean="mean", ours_min="min", ours_max="max", ours_sd="std", n_seeds="count").reset_index()
    out["status"] = np.where(out["n_seeds"] > 0, "ok", NOT_IMPLEMENTED)
    out["ours_sd"] = out["ours_sd"].fillna(0.0)
    out.insert(0, "table", table)
    out["selection"] = spec["selection"]
    out["column"] = [column_key(b, d, m) for b, d, m in zip(out["benchmark"], out["direction"], out["metric"])]
    paper = _paper_values(table)
    if paper is not None:
        paper = paper.rename(columns={"value": "paper"})[keys + ["paper"]]
        out = out.merge(paper, on=keys, how="left")
    else:
        out["paper"] = math.nan
    out["delta"] = out["ours_mean"] - out["paper"]
    for source in ("ours_mean", "paper"):
        best = out.groupby("column")[source].transform("max")
        out[f"best_{source.split('_')[0]}"] = out[source].notna() & (out[source] == best)
    return out


def _row_order(reg: Registry, table: str) -> list[str]:
    return list(dict.fromkeys(cell.row for cell in reg.cells(table)))


def _columns(reg: Registry, table: str) -> list[tuple[str, str, str]]:
    spec = reg.params["tables"][table]
    cols = [(b, d, m) for b in spec["benchmarks"] for d in spec["directions"] for m in spec["metrics"]]
    return cols + ([AVG] if spec.get("average_column") else [])


def _header(reg: Registry, col: tuple[str, str, str], latex: bool = False) -> str:
    if col == AVG:
        return "Avg"
    bench, direction, metric = col
    label = reg.params["benchmarks"][bench]["label"]
    return f"{label} {(DIRECTION_LATEX if latex else DIRECTION_LABELS)[direction]} {metric}"


def _lookup(frame: pd.DataFrame, row: str, col: tuple[str, str, str]) -> pd.Series | None:
    hit = frame[(frame["row"] == row) & (frame["benchmark"] == col[0]) & (frame["direction"] == col[1])
                & (frame["metric"] == col[2])]
    return None if hit.empty else hit.iloc[0]


def _fmt_ours(cell: pd.Series, bold: str) -> str:
    if cell["status"] != "ok":
        return "n/i"
    text = f"{cell['ours_mean']:.2f}"
    if cell["n_seeds"] > 1:
        text += f" ±{(cell['ours_max'] - cell['ours_min']) / 2:.2f}"
    return bold.format(text) if cell["best_ours"] else text


def _fmt_value(value: float, best: bool, bold: str, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = f"{value:+.2f}" if signed else f"{value:.2f}"
    return bold.format(text) if best else text


def _blocks(reg: Registry, table: str, frame: pd.DataFrame, bold: str):
    cols = _columns(reg, table)
    for block in ("ours", "paper", "delta"):
        lines = []
        for row in _row_order(reg, table):
            cells = []
            for col in cols:
                cell = _lookup(frame, row, col)
                if cell is None:
                    cells.append("–")
                elif block == "ours":
                    cells.append(_fmt_ours(cell, bold))
                elif block == "paper":
                    cells.append(_fmt_value(cell["paper"], bool(cell["best_paper"]), bold))
                else:
                    cells.append(_fmt_value(cell["delta"], False, bold, signed=True))
            lines.append((row, cells))
        yield block, lines


BLOCK_TITLES = {
    "ours": "Reproduced ({profile} profile, mean ± half-range over seeds {seeds}; {selection} epoch)",
    "paper": "Paper (Long-CLIP-L on the real benchmarks)",
    "delta": "Δ = reproduced − paper (different scale: compare directions of effect, not values)",
}


def to_markdown(reg: Registry, table: str, frame: pd.DataFrame) -> str:
    spec = reg.params["tables"][table]
    cols = _columns(reg, table)
    context = {"profile": reg.profile_name, "seeds": reg.table_seeds(table), "selection": spec["selection"]}
    out = [f"# {spec['title']}", "",
           f"Profile `{reg.profile_name}`; epoch selection: **{spec['selection']}**; best per column in bold.", ""]
    if (frame["status"] != "ok").any():
        out += [f"n/i: {NOT_IMPLEMENTED} (the baseline's own framework is a later issue); its paper values are shown.", ""]
    if reg.profile_name != "paper":
        out += ["> The reproduced numbers come from the embedded miniature (synthetic benchmarks, tiny CLIP):",
                "> a different scale from the paper. Compare directions of effect, not absolute values.", ""]
    for block, lines in _blocks(reg, table, frame, "**{}**"):
        out += [f"**{BLOCK_TITLES[block].format(**context)}**", "",
                "| row | " + " | ".join(_header(reg, c) for c in cols) + " |",
                "|---|" + "---|" * len(cols)]
        out += [f"| {row} | " + " | ".join(cells) + " |" for row, cells in lines]
        out.append("")
    return "\n".join(out)


def _latex_escape(text: str) -> str:
    return text.replace("_", r"\_").replace("%", r"\%").replace("±", r"$\pm$").replace("Δ", r"$\Delta$") \
        .replace("−", "-").replace("γ", r"$\gamma$")


def to_latex(reg: Registry, table: str, frame: pd.DataFrame) -> str:
    spec = reg.params["tables"][table]
    cols = _columns(reg, table)
    context = {"profile": reg.profile_name, "seeds": reg.table_seeds(table), "selection": spec["selection"]}
    out = [f"% {spec['title']} -- generated by hnclip; profile {reg.profile_name}, {spec['selection']} epoch",
           r"\begin{tabular}{l" + "r" * len(cols) + "}", r"\toprule",
           "row & " + " & ".join(_header(reg, c, latex=True) for c in cols) + r" \\"]
    for block, lines in _blocks(reg, table, frame, r"\textbf{{{}}}"):
        out += [r"\midrule", rf"\multicolumn{{{len(cols) + 1}}}{{l}}{{\emph{{{_latex_escape(BLOCK_TITLES[block].format(**context))}}}}} \\"]
        out += [_latex_escape(row) + " & " + " & ".join(_latex_escape(c) for c in cells) + r" \\" for row, cells in lines]
    out += [r"\bottomrule", r"\end{tabular}", ""]
    return "\n".join(out)


def eval_inputs(reg: Registry, table: str) -> dict[str, Path]:
    return {f"{c.run_id}/{c.benchmark}": paths.evaluation(c.run_id, c.benchmark) for c in reg.cells(table) if c.run_id}
