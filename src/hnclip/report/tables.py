"""Paper tables from evaluation records: reproduced value (mean and spread over seeds), the paper's
value and the delta, cell by cell, plus the paper's summary cells computed the paper's way (Avg,
max|Δ|, Δ avg R@1, best epoch), as tidy CSV, Markdown and LaTeX in the paper's layout."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from hnclip.config import paths
from hnclip.config.cells import AVG, DIRECTION_LABELS, canonical_row, column_key
from hnclip.config.registry import NOT_IMPLEMENTED, Registry
from hnclip.errors import StaleArtifactError
from hnclip.io import read_json, read_jsonl
from hnclip.report import paper_reference
from hnclip.report.gradient_stats import exact_zero_shares, probe_log
from hnclip.report.render import Band, Block, Cell, Column, latex_tabular, markdown_blocks

KEYS = ["row", "benchmark", "direction", "metric"]
KNOB_SYMBOLS = {"gamma": "γ", "lambda_tok": "λ_tok"}
# Summary columns (metric -> header) and the summary row, as paper_tables.yaml names them.
SUMMARY_HEADERS = {"avg": "Avg", "max_abs_delta": "max|Δ|", "delta_avg_r1": "Δ avg R@1"}
BEST_EPOCH = "best_epoch"
# Rules (paper_tables.yaml's `derived_columns`): computed within one seed of a row, or between a
# row and its partner row (`vs`) from their means over seeds.
MEAN_R1, SELECTED_EPOCH = "mean_r1", "selected_epoch"
MAX_ABS_DIFF_VS, MEAN_R1_DIFF_VS = "max_abs_diff_vs", "mean_r1_diff_vs"
SELECTION_METRIC_LABELS = {"mean_r1": "mean R@1", "rsum": "rsum"}  # evaluation.selection_metric, as printed
# A table's gradient-probe section (its `probe_rows`, Table X1): metric -> header, in print order.
PROBE_COUNT = "probes"
PROBE_HEADERS = {PROBE_COUNT: "probes", "zero_loss_fp32": "L_CLIP = 0 (fp32)",
                 "zero_norm_fp32": "‖∇‖ = 0 (fp32 norm)", "zero_grad_fp32": "∇ ≡ 0 (fp32)",
                 "zero_grad_bf16": "∇ ≡ 0 (bf16 autocast)"}
PROBE_DIRECTION = "none"
NOT_PROBED = "not probed"


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


# ---- row labels ----------------------------------------------------------------------------------

def _setting(knob: str, value) -> str:
    if knob == "fraction":
        return f"{float(value) * 100:g}% data"
    shown = f"{value:g}" if isinstance(value, (int, float)) else str(value)
    return f"{KNOB_SYMBOLS.get(knob, knob)} = {shown}"


def row_labels(reg: Registry, table: str) -> dict[str, str]:
    """Row key -> printed label: the method's params.yaml label plus what the row changes (its
    training set, its benchmark, its settings, its seed): "HN-CLIP, DCI → DOCCI", "GOAL, DOCCI,
    5% data", "HN-CLIP, seed 43"; a vary-table's rows are its setting ("γ = 0.5")."""
    spec = reg.params["tables"][table]
    if "vary" in spec:
        (knob, values), = spec["vary"].items()
        return {f"{knob}={value:g}": _setting(knob, value) for value in values}
    names = {bench: entry["label"] for bench, entry in reg.params["benchmarks"].items()}
    labels = {}
    for row in spec["rows"]:
        tested = " / ".join(names.get(b, b) for b in row.get("benchmarks", []))
        parts = []
        if "train" in row:
            trained = names.get(row["train"], row["train"].upper())
            parts.append(f"{trained} → {tested}" if tested else f"trained on {trained}")
        elif tested:
            parts.append(tested)
        parts += [_setting(knob, value) for knob, value in row.get("set", {}).items()]
        if "seed" in row:
            parts.append(f"seed {row['seed']}")
        labels[row["key"]] = ", ".join([reg.params["methods"][row["method"]]["label"], *parts])
    return labels


# ---- summary cells -------------------------------------------------------------------------------

def summary_rules(table: str, spec: dict) -> dict[str, str]:
    """Summary metric -> rule, the paper's way (paper_tables.yaml's `derived_columns`): `avg` is the
    mean of the row's R@1 cells (Table 3b: 74.10 = mean(79.39, 78.34, 70.24, 68.44), not the mean of
    all twelve), A8's `max_abs_delta` and A9's `delta_avg_r1` compare a row with its partner, and A2
    prints each row's best epoch per benchmark. The table's `average_column` switches the Avg on."""
    paper = {}
    if table in paper_reference.table_names():
        meta = paper_reference.table_meta(table)
        paper = dict(meta.get("derived_columns", {}))
        if meta.get("per_benchmark", {}).get("metric") == BEST_EPOCH:
            paper[BEST_EPOCH] = SELECTED_EPOCH
    rules = {metric: rule for metric, rule in paper.items() if metric != "avg"}
    if spec.get("average_column"):
        rules["avg"] = paper.get("avg", MEAN_R1)
    return rules


def partners(table: str) -> dict[str, str]:
    """Row -> the row its pairwise summary compares it with (the paper's `vs`), as canonical keys."""
    if table not in paper_reference.table_names():
        return {}
    return {canonical_row(row["key"]): canonical_row(row["vs"])
            for row in paper_reference.table_meta(table)["rows"] if "vs" in row}


def seed_summaries(per_seed: pd.DataFrame, rules: dict[str, str]) -> pd.DataFrame:
    """Summary cells computed within one seed of a row (columns row, seed, benchmark, direction,
    metric, value): the mean of its R@1 cells, and its selected epoch per benchmark."""
    frames = []
    for metric, rule in rules.items():
        if rule == MEAN_R1:
            r1 = per_seed[per_seed["metric"] == "R@1"]
            cells = r1.groupby(["row", "seed"], sort=False, as_index=False)["value"].mean()
            cells["benchmark"], cells["direction"] = AVG[:2]
        elif rule == SELECTED_EPOCH:
            cells = per_seed.groupby(["row", "benchmark", "seed"], sort=False, as_index=False)["epoch"].first()
            cells = cells.rename(columns={"epoch": "value"}).assign(direction="both")
        elif rule in (MAX_ABS_DIFF_VS, MEAN_R1_DIFF_VS):
            continue
        else:
            raise ValueError(f"unknown summary rule {rule!r} for {metric!r}")
        frames.append(cells.assign(metric=metric, value=pd.to_numeric(cells["value"])))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*KEYS, "seed", "value"])


def paired_summaries(cells: pd.DataFrame, rules: dict[str, str], pairs: dict[str, str],
                     value: str = "value") -> pd.DataFrame:
    """Summary cells comparing a row with its partner, from one value per recall cell (reproduced:
    the mean over seeds): max_abs_diff_vs = the largest |row − partner| over the cells both have
    (A8's max|Δ| on the seed-43 row); mean_r1_diff_vs = the row's mean R@1 minus the partner's (A9's
    Δ on the HN-CLIP row). NaN where either side is missing a value."""
    recall = cells[cells["metric"].str.startswith("R@")]
    canonical = recall["row"].map(canonical_row)
    index = ["benchmark", "direction", "metric"]
    out = []
    for row in dict.fromkeys(recall["row"]):
        partner = pairs.get(canonical_row(row))
        if partner is None or not (canonical == partner).any():
            continue
        both = pd.concat([recall[canonical == canonical_row(row)].set_index(index)[value],
                          recall[canonical == partner].set_index(index)[value]], axis=1, join="inner", keys=["a", "b"])
        benchmarks = both.index.unique("benchmark")
        for metric, rule in rules.items():
            if rule == MAX_ABS_DIFF_VS:
                result = (both["a"] - both["b"]).abs().max(skipna=False)
            elif rule == MEAN_R1_DIFF_VS:
                r1 = both[both.index.get_level_values("metric") == "R@1"]
                result = r1["a"].mean(skipna=False) - r1["b"].mean(skipna=False)
            else:
                continue
            out.append({"row": row, "benchmark": benchmarks[0] if len(benchmarks) == 1 else "all",
                        "direction": "both", "metric": metric, value: result})
    return pd.DataFrame(out, columns=[*KEYS, value])


# ---- the tidy frame ------------------------------------------------------------------------------

def _paper_values(table: str) -> pd.DataFrame | None:
    if table not in paper_reference.table_names():
        return None
    paper = paper_reference.paper_table(table)
    return paper.assign(row=paper["row"].map(canonical_row))


def aggregate(reg: Registry, table: str, per_seed: pd.DataFrame) -> pd.DataFrame:
    """One row per printed cell (summary cells included): the reproduced mean, min, max and SD over
    seeds, the paper's value, their difference and whether each is the best of its column."""
    spec = reg.params["tables"][table]
    rules = summary_rules(table, spec)
    both = pd.concat([per_seed[[*KEYS, "seed", "value"]], seed_summaries(per_seed, rules)], ignore_index=True)
    grouped = both.groupby(KEYS, sort=False)["value"]
    out = grouped.agg(ours_mean="mean", ours_min="min", ours_max="max", ours_sd="std", n_seeds="count").reset_index()
    paired = paired_summaries(out, rules, partners(table), value="ours_mean")
    if not paired.empty:
        seeds = out.groupby("row")["n_seeds"].min()
        paired = paired.assign(ours_min=paired["ours_mean"], ours_max=paired["ours_mean"], ours_sd=0.0,
                               n_seeds=np.where(paired["ours_mean"].notna(), paired["row"].map(seeds), 0))
        out = pd.concat([out, paired], ignore_index=True)
    out["n_seeds"] = out["n_seeds"].astype(int)
    out["status"] = np.where(out["n_seeds"] > 0, "ok", NOT_IMPLEMENTED)
    out["ours_sd"] = out["ours_sd"].fillna(0.0)
    out.insert(0, "table", table)
    out.insert(2, "label", out["row"].map(row_labels(reg, table)))
    out["selection"] = spec["selection"]
    out["column"] = [column_key(b, d, m) for b, d, m in zip(out["benchmark"], out["direction"], out["metric"])]
    paper = _paper_values(table)
    if paper is not None:
        paper = paper.rename(columns={"value": "paper"})[[*KEYS, "paper"]]
        out = out.merge(paper, on=KEYS, how="left")
    else:
        out["paper"] = math.nan
    out["delta"] = out["ours_mean"] - out["paper"]
    ranked = out["metric"].str.startswith("R@") | (out["metric"] == "avg")  # higher is better
    for source in ("ours_mean", "paper"):
        best = out.groupby("column")[source].transform("max")
        out[f"best_{source.split('_')[0]}"] = ranked & out[source].notna() & (out[source] == best)
    probes = probe_frame(reg, table)
    return out if probes.empty else pd.concat([out, probes], ignore_index=True)


def probe_frame(reg: Registry, table: str) -> pd.DataFrame:
    """The gradient-probe section of a table with `probe_rows`: per probed run (one per training set),
    how many batches were probed and the share (%) of them on which each exact-zero measure of
    `EXACT_ZERO_MEASURES` holds; `n_probes` says how many rows measured it. Empty for other tables."""
    spec, labels = reg.params["tables"][table], row_labels(reg, table)
    rows = []
    for cell in reg.probe_cells(table):
        path = probe_log(cell.run_id)
        records = read_jsonl(path) if path.is_file() else []
        measured = {PROBE_COUNT: (float(len(records)), len(records))}
        measured.update({name: (math.nan if value is None else 100 * value, count)
                         for name, (value, count) in exact_zero_shares(records).items()})
        for metric, (value, count) in measured.items():
            rows.append({"table": table, "row": cell.row, "label": labels.get(cell.row, cell.row),
                         "benchmark": cell.benchmark, "direction": PROBE_DIRECTION, "metric": metric,
                         "ours_mean": value if records else math.nan, "ours_min": value if records else math.nan,
                         "ours_max": value if records else math.nan, "ours_sd": 0.0, "n_seeds": 1 if records else 0,
                         "status": "ok" if records else NOT_PROBED, "selection": spec["selection"],
                         "column": column_key(cell.benchmark, PROBE_DIRECTION, metric), "paper": math.nan,
                         "delta": math.nan, "best_ours": False, "best_paper": False, "run_id": cell.run_id,
                         "seed": cell.seed, "n_probes": count})
    return pd.DataFrame(rows)


def _probe_band(reg: Registry, frame: pd.DataFrame) -> Band | None:
    probes = frame[frame["direction"] == PROBE_DIRECTION] if "n_probes" in frame else frame.iloc[:0]
    if probes.empty:
        return None
    names = {b: entry["label"] for b, entry in reg.params["benchmarks"].items()}
    columns = [Column(header, ("% of probed batches",) if metric != PROBE_COUNT else ())
               for metric, header in PROBE_HEADERS.items()]
    rows = []
    several_seeds = probes["seed"].nunique() > 1  # one band row per probed run: each seed its own
    for (row, benchmark, seed), group in probes.groupby(["row", "benchmark", "seed"], sort=False):
        values = group.set_index("metric")
        cells = []
        for metric in PROBE_HEADERS:
            entry = values.loc[metric] if metric in values.index else None
            if entry is None or entry["status"] != "ok":
                cells.append(Cell(NOT_PROBED if entry is not None else "–"))
            elif math.isnan(entry["ours_mean"]):
                cells.append(Cell("–"))
            else:
                digits = 0 if metric == PROBE_COUNT else 1
                cells.append(Cell(f"{entry['ours_mean']:.{digits}f}"))
        seed_note = f", seed {int(seed)}" if several_seeds else ""  # a float once concatenated with NaN
        rows.append((f"{group['label'].iloc[0]}, {names.get(benchmark, benchmark)} run{seed_note}", cells))
    return Band(columns, [Block(None, rows)])


PROBE_NOTE = (
    "The gradient probe measures L_CLIP on the batch being trained (the first micro-batch of each probed "
    "optimizer step) four ways, on the same batches. L_CLIP = 0: the fp32 loss is exactly 0. ‖∇‖ = 0 (fp32 "
    "norm): the norm of the fp32 gradient, computed in fp32 as a trainer's gradient clipping does, is exactly 0 "
    "(squares underflow once every entry is below ~1e-22), whether or not the gradient is. ∇ ≡ 0: every entry "
    "of the gradient w.r.t. the trained parameters is exactly 0.0, in fp32, and with the forward and the loss "
    "under bf16 autocast (open_clip's training step: matmuls in bf16, softmax and cross-entropy in fp32). "
    "The paper: \"its gradient reaches exact zero in fp32 in 47 % of measurements\" (Long-CLIP-L, DOCCI, Fig. 4).")


# ---- layout: bands, grouped columns, blocks ------------------------------------------------------

def _row_order(reg: Registry, table: str) -> list[str]:
    return list(dict.fromkeys(cell.row for cell in reg.cells(table)))


def _by_row_benchmark(spec: dict) -> bool:
    """Every row on its own single benchmark (A9, A10): the columns drop the benchmark level and the
    row labels name it, as the paper prints them."""
    rows = spec.get("rows", [])
    return len(spec["benchmarks"]) > 1 and bool(rows) and all(len(row.get("benchmarks", ())) == 1 for row in rows)


def _band_benchmarks(table: str, spec: dict) -> list[list[str | None]]:
    """The benchmarks of each band: the paper's split (its upper and lower band) where it splits."""
    benchmarks = [None] if _by_row_benchmark(spec) else list(spec["benchmarks"])
    count = paper_reference.table_meta(table).get("bands", 1) if table in paper_reference.table_names() else 1
    size = math.ceil(len(benchmarks) / min(count, len(benchmarks)))
    return [benchmarks[i:i + size] for i in range(0, len(benchmarks), size)]


class _Layout:
    """Where each printed cell of a table sits, and its text in each block."""

    def __init__(self, reg: Registry, table: str, frame: pd.DataFrame, markdown: bool):
        self.table, self.spec, self.markdown = table, reg.params["tables"][table], markdown
        self.rows = _row_order(reg, table)
        self.labels = row_labels(reg, table)
        self.rules = summary_rules(table, self.spec)
        records = frame.to_dict("records")
        self.cells = {tuple(r[k] for k in KEYS): r for r in records}
        self.summaries = {(r["row"], r["metric"]): r for r in records if r["metric"] in SUMMARY_HEADERS}
        plain = frame[frame["metric"].isin(self.spec["metrics"])]
        self.row_benchmark = plain.groupby("row")["benchmark"].first().to_dict()
        self.bench_names = {b: entry["label"] for b, entry in reg.params["benchmarks"].items()}

    def stub(self) -> str:
        """The row-label column's header: the varied setting's symbol (γ), else "Method"."""
        knob = next(iter(self.spec.get("vary", {})), None)
        return KNOB_SYMBOLS.get(knob, knob) if knob else "Method"

    def _leaves(self, benchmarks: list[str | None]) -> list[tuple[str | None, str, str]]:
        return [(b, d, m) for b in benchmarks for d in self.spec["directions"] for m in self.spec["metrics"]]

    def columns(self, benchmarks: list[str | None], last: bool) -> list[Column]:
        out = [Column(m, ((self.bench_names.get(b, b),) if b else ()) + (DIRECTION_LABELS.get(d, d),))
               for b, d, m in self._leaves(benchmarks)]
        return out + ([Column(SUMMARY_HEADERS[m]) for m in self._summary_metrics()] if last else [])

    def _summary_metrics(self) -> list[str]:
        return [metric for metric in SUMMARY_HEADERS if metric in self.rules]

    def _text(self, cell: dict | None, block: str) -> Cell:
        if cell is None:
            return Cell("–")
        if block == "ours":
            if cell["status"] != "ok":
                return Cell("n/i")
            text = f"{cell['ours_mean']:.2f}"
            paired = self.rules.get(cell["metric"]) in (MAX_ABS_DIFF_VS, MEAN_R1_DIFF_VS)  # from seed means
            if self.markdown and cell["n_seeds"] > 1 and not paired:
                text += f" ±{(cell['ours_max'] - cell['ours_min']) / 2:.2f}"
            return Cell(text, bold=bool(cell["best_ours"]))
        value = cell["paper"] if block == "paper" else cell["delta"]
        if value is None or math.isnan(value):
            return Cell("–")
        return Cell(f"{value:+.2f}" if block == "delta" else f"{value:.2f}",
                    bold=block == "paper" and bool(cell["best_paper"]))

    def _epoch(self, cell: dict | None, block: str) -> str:
        if cell is None:
            return "–"
        if block == "paper":
            return "–" if math.isnan(cell["paper"]) else f"{cell['paper']:g}"
        if cell["status"] != "ok":
            return "n/i"
        low, high = cell["ours_min"], cell["ours_max"]
        return f"{low:g}" if low == high else f"{low:g}–{high:g}"

    def _epoch_row(self, benchmarks: list[str | None], block: str, width: int) -> tuple[str, list[Cell]]:
        """A2's "best epoch (default / frozen)" row: per benchmark, each row's selected epoch, in row order."""
        span = len(self.spec["directions"]) * len(self.spec["metrics"])
        cells = [Cell(" / ".join(self._epoch(self.cells.get((row, b, "both", BEST_EPOCH)), block) for row in self.rows),
                      span=span) for b in benchmarks]
        cells += [Cell("")] * (width - span * len(benchmarks))
        return f"{self.spec['selection']} epoch (rows in order)", cells

    def block(self, benchmarks: list[str | None], last: bool, block: str, title: str | None) -> Block:
        leaves = self._leaves(benchmarks)
        summaries = self._summary_metrics() if last else []
        rows = []
        for row in self.rows:
            cells = [self._text(self.cells.get((row, b or self.row_benchmark.get(row), d, m)), block)
                     for b, d, m in leaves]
            cells += [self._text(self.summaries.get((row, metric)), block) for metric in summaries]
            rows.append((self.labels.get(row, row), cells))
        if BEST_EPOCH in self.rules and block != "delta" and None not in benchmarks:
            rows.append(self._epoch_row(benchmarks, block, len(leaves) + len(summaries)))
        return Block(title, rows)

    def bands(self, titles: dict[str, str], banded: bool) -> list[Band]:
        groups = _band_benchmarks(self.table, self.spec) if banded else [
            [b for band in _band_benchmarks(self.table, self.spec) for b in band]]
        return [Band(self.columns(benches, i == len(groups) - 1),
                     [self.block(benches, i == len(groups) - 1, block, title) for block, title in titles.items()])
                for i, benches in enumerate(groups)]


def transfer_note(reg: Registry, table: str) -> str | None:
    """Which weights a `best` table's transfer cells (a run tested off its in-domain benchmarks: A7,
    A10's cross rows) show: the checkpoint selected on the run's own training benchmark, row by row
    with its epoch, read from the evaluation records. None for a table without such cells."""
    if reg.params["tables"][table]["selection"] != "best":
        return None  # `last`: every cell, transfer or not, is the final epoch
    labels, names = row_labels(reg, table), {b: entry["label"] for b, entry in reg.params["benchmarks"].items()}
    chosen: dict[str, list[tuple[int, dict]]] = {}
    for cell in reg.cells(table):
        if cell.run_id and cell.train_set and cell.benchmark not in reg.eval_benchmarks(cell.train_set):
            path = paths.evaluation(cell.run_id, cell.benchmark)
            best = read_json(path)["best"]
            if "selected_on" not in best:
                raise StaleArtifactError(f"{path} was encoded from the last epoch's weights, not the checkpoint "
                                         f"selected on the run's own benchmark: rerun `hnclip evaluate --run "
                                         f"{cell.run_id} --benchmark {cell.benchmark}` (the workflow does)")
            chosen.setdefault(cell.row, []).append((cell.seed, best))
    if not chosen:
        return None
    metrics = sorted({best["selected_on"]["metric"] for entries in chosen.values() for _, best in entries})
    rows = []
    for row, entries in chosen.items():
        entries.sort(key=lambda entry: entry[0])
        trained_on = " / ".join(dict.fromkeys(names.get(b["selected_on"]["benchmark"]) for _, b in entries))
        epochs = "/".join(str(best["epoch"]) for _, best in entries)
        seeds = f" (seeds {'/'.join(str(seed) for seed, _ in entries)})" if len(entries) > 1 else ""
        rows.append(f"{labels.get(row, row)}: epoch{'s' if len(entries) > 1 else ''} {epochs} on {trained_on}{seeds}")
    return (f"Transfer cells: the checkpoint selected on the run's own training benchmark by "
            f"{' / '.join(SELECTION_METRIC_LABELS.get(m, m) for m in metrics)} (the model the method would ship, "
            f"not the best epoch on the transfer benchmark): {'; '.join(rows)}.")


def _seed_text(seeds: list[int], spread: str) -> str:
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    return f"{spread} over seeds {', '.join(str(s) for s in seeds)}"


def _titles(reg: Registry, table: str, markdown: bool) -> dict[str, str]:
    spec = reg.params["tables"][table]
    seeds = _seed_text(reg.table_seeds(table), "mean ± half-range" if markdown else "mean")
    caveat = " (different scale: compare directions of effect, not values)" if markdown else ""
    return {"ours": f"Reproduced ({reg.profile_name} profile, {seeds}; {spec['selection']} epoch)",
            "paper": "Paper (Long-CLIP-L on the real benchmarks)",
            "delta": f"Δ = reproduced − paper{caveat}"}


def to_markdown(reg: Registry, table: str, frame: pd.DataFrame) -> str:
    spec = reg.params["tables"][table]
    out = [f"# {spec['title']}", "",
           f"Profile `{reg.profile_name}`; epoch selection: **{spec['selection']}**; best per column in bold.", ""]
    note = transfer_note(reg, table)
    if note:
        out += [note, ""]
    if (frame["status"] != "ok").any():
        out += [f"n/i: {NOT_IMPLEMENTED} (the baseline's own framework is a later issue); its paper values are "
                "shown.", ""]
    if reg.profile_name != "paper":
        out += ["> The reproduced numbers come from the embedded miniature (synthetic benchmarks, tiny CLIP):",
                "> a different scale from the paper. Compare directions of effect, not absolute values.", ""]
    layout = _Layout(reg, table, frame, markdown=True)
    band, = layout.bands(_titles(reg, table, markdown=True), banded=False)
    out += markdown_blocks(layout.stub(), band)
    probes = _probe_band(reg, frame)
    if probes is not None:
        out += ["## Exact-zero L_CLIP gradients: fp32 vs bf16 autocast (gradient probe)", "", PROBE_NOTE, ""]
        out += markdown_blocks("Run", probes)
    return "\n".join(out)


def to_latex(reg: Registry, table: str, frame: pd.DataFrame) -> str:
    """A booktabs tabular in the paper's layout (grouped headers, the paper's bands), values only:
    the spread over seeds is in the Markdown and the CSV."""
    spec = reg.params["tables"][table]
    layout = _Layout(reg, table, frame, markdown=False)
    bands = layout.bands(_titles(reg, table, markdown=False), banded=True)
    out = [f"% {spec['title']} -- generated by hnclip; profile {reg.profile_name}, {spec['selection']} epoch",
           "% rows: params.yaml method labels; spread over seeds: see the .md and .csv"]
    note = transfer_note(reg, table)
    if note:
        out.append(f"% {note}")
    out += latex_tabular(layout.stub(), bands)
    probes = _probe_band(reg, frame)
    if probes is not None:  # a second tabular under the first: exact-zero L_CLIP gradients (see the .md)
        out += [r"\par\medskip", *latex_tabular("Run", [probes])[1:]]
    return "\n".join(out) + "\n"


def eval_inputs(reg: Registry, table: str) -> dict[str, Path]:
    """The files a table reads: its cells' evaluation records and its probed runs' probe logs."""
    inputs = {f"{c.run_id}/{c.benchmark}": paths.evaluation(c.run_id, c.benchmark) for c in reg.cells(table)
              if c.run_id}
    inputs.update({f"probe:{c.run_id}": probe_log(c.run_id) for c in reg.probe_cells(table)
                   if probe_log(c.run_id).is_file()})
    return inputs


def probe_inputs(reg: Registry, table: str) -> list[Path]:
    """The training records of the runs whose probe logs a table reports (their jobs write the logs)."""
    return [paths.run_record(c.run_id) for c in reg.probe_cells(table)]
