"""`hnclip metrics`: results/metrics.json (headline numbers, what `dvc metrics show/diff` and
`dvc exp show` display), results/plots/convergence.csv (the convergence curves `dvc plots show`
draws) and results/metrics.provenance.json (what both were computed from), from the tables, the claims
scorecard and the evaluation records the workflow wrote. Plain numbers only: DVC diffs them across
commits and experiments; where they come from goes into the sibling provenance record."""
from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from hnclip import provenance
from hnclip.claims.scorecard import CLAIMS_CSV, VERDICTS
from hnclip.config import paths
from hnclip.config.cells import AVG
from hnclip.config.registry import Registry
from hnclip.io import read_json, write_json, write_text

METRICS = paths.RESULTS / "metrics.json"
PROVENANCE = paths.RESULTS / "metrics.provenance.json"
CONVERGENCE = paths.RESULTS / "plots" / "convergence.csv"
CONVERGENCE_COLUMNS = ["figure", "series", "benchmark", "epoch", "mean_r1"]
# The paper's headline claim: HN-CLIP above plain Long-CLIP fine-tuning on every benchmark.
HEADLINE_METHODS = ("hn_clip", "longclip_ft")
HEADLINE_SELECTION = "best"  # the paper reports the best epoch
DIGITS = 4  # R@1 in percent: 4 decimals keep diffs stable and lose nothing a test set resolves


def table_mean_r1(frame: pd.DataFrame) -> float | None:
    """Mean R@1 of a table's reproduced rows (its tidy CSV): each row's mean over its benchmarks
    and directions, as a table's Avg column averages a row, then the mean over the rows. None when
    no row is reproduced."""
    r1 = frame[(frame["metric"] == "R@1") & (frame["benchmark"] != AVG[0]) & (frame["status"] == "ok")]
    if r1.empty:
        return None
    return float(r1.groupby("row", sort=False)["ours_mean"].mean().mean())


def headline_evaluations(reg: Registry) -> dict[str, dict[str, list[Path]]]:
    """benchmark -> headline method -> the evaluation records of its in-domain runs (the
    benchmark's own training set, the profile's seeds), for those some table plans."""
    planned = set(reg.evaluations())
    found: dict[str, dict[str, list[Path]]] = {}
    for bench, spec in reg.params["benchmarks"].items():
        for method in HEADLINE_METHODS:
            settings = reg.params["methods"].get(method)
            if settings is None:
                continue
            runs = [reg.run_spec(spec["train"], settings, seed, register=False).run_id for seed in reg.profile["seeds"]]
            records = [paths.evaluation(run, bench) for run in runs if (run, bench) in planned]
            if records:
                found.setdefault(bench, {})[method] = records
    return found


def claim_counts(scorecard: pd.DataFrame) -> dict[str, int]:
    """How many of the paper's claims got each verdict (every verdict, zeros included)."""
    counts = scorecard["verdict"].value_counts()
    return {verdict: int(counts.get(verdict, 0)) for verdict in VERDICTS}


def mean_r1(evaluation: dict, selection: str = HEADLINE_SELECTION) -> float:
    """Mean of the text-to-image and image-to-text R@1 of one evaluation record's selected epoch."""
    metrics = evaluation[selection]["metrics"]
    return (metrics["t2i"]["R@1"] + metrics["i2t"]["R@1"]) / 2


def headline(reg: Registry) -> dict[str, dict[str, float]]:
    """benchmark -> {method: mean R@1 over seeds, "delta": first method minus second} ."""
    out = {}
    for bench, methods in headline_evaluations(reg).items():
        values = {m: sum(mean_r1(read_json(p)) for p in records) / len(records) for m, records in methods.items()}
        if set(HEADLINE_METHODS) <= set(values):
            values["delta"] = values[HEADLINE_METHODS[0]] - values[HEADLINE_METHODS[1]]
        out[bench] = values
    return out


def convergence_figures(reg: Registry) -> dict[str, dict]:
    """params.yaml's figures of kind `convergence` (paper Fig. 5: mean R@1 per epoch)."""
    return {name: spec for name, spec in reg.params.get("figures", {}).items() if spec["kind"] == "convergence"}


def convergence_rows(reg: Registry) -> pd.DataFrame:
    """The curves of every convergence figure in long form (CONVERGENCE_COLUMNS), exactly the
    figure's points: epoch 0 is the initial backbone; a curve averages its cell's seeds."""
    from hnclip.report.figures import _mean_curve  # the figure's own curve, so that plot and PNG agree
    rows = []
    for name, spec in convergence_figures(reg).items():
        for label, cells in reg.figure_series(spec).items():
            for bench in dict.fromkeys(c.benchmark for c in cells):
                epochs, values = _mean_curve(cells, bench, None)
                rows += [{"figure": name, "series": label, "benchmark": bench, "epoch": e, "mean_r1": round(v, DIGITS)}
                         for e, v in zip(epochs, values)]
    return pd.DataFrame(rows, columns=CONVERGENCE_COLUMNS)


def inputs(reg: Registry) -> dict[str, Path]:
    """Every file the metrics and curves are read from: the tables' CSVs, the claims scorecard and
    evaluation records."""
    found = {f"table:{t}": paths.table(t, "csv") for t in reg.tables}
    found["claims"] = CLAIMS_CSV
    for bench, methods in headline_evaluations(reg).items():
        found.update({f"eval:{p.parent.name}/{bench}": p for records in methods.values() for p in records})
    for spec in convergence_figures(reg).values():
        found.update({f"eval:{c.run_id}/{c.benchmark}": paths.evaluation(c.run_id, c.benchmark)
                      for c in reg.figure_cells(spec)})
    return found


def headline_metrics(reg: Registry) -> dict:
    """{table: {"mean_r1": x}, ..., "headline": {benchmark: {method: x, "delta": x}},
    "claims": {verdict: count}}, R@1 rounded."""
    out: dict = {}
    for table in reg.tables:
        value = table_mean_r1(pd.read_csv(paths.table(table, "csv")))
        if value is not None:
            out[table] = {"mean_r1": round(value, DIGITS)}
    out["headline"] = {bench: {key: round(value, DIGITS) for key, value in values.items()}
                       for bench, values in headline(reg).items()}
    out["claims"] = claim_counts(pd.read_csv(CLAIMS_CSV))
    return out


def write_metrics(reg: Registry) -> list[Path]:
    """Write the metrics, the convergence curves and their provenance; return their paths."""
    started = time.time()
    write_json(METRICS, headline_metrics(reg))
    write_text(CONVERGENCE, convergence_rows(reg).to_csv(index=False))
    written = [METRICS, CONVERGENCE]
    record = provenance.record(
        "metrics", inputs=inputs(reg), wall_time_s=time.time() - started,
        params={"profile": reg.profile_name, "headline_methods": list(HEADLINE_METHODS),
                "headline_selection": HEADLINE_SELECTION, "seeds": reg.profile["seeds"]},
        extra={"outputs": {str(p): provenance.file_sha256(p) for p in written}})
    write_json(PROVENANCE, record)
    return written + [PROVENANCE]
