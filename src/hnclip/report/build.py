"""Build one paper table (CSV, Markdown, LaTeX), its figure and its provenance record."""
from __future__ import annotations

import time
from pathlib import Path

from hnclip import provenance
from hnclip.config import paths
from hnclip.config.registry import TRAINED_FRAMEWORKS, Registry
from hnclip.io import write_json, write_text
from hnclip.report import tables


def _records(frame) -> list[dict]:
    """Rows as JSON-safe dicts (missing values as null, not NaN)."""
    return frame.astype(object).where(frame.notna(), None).to_dict(orient="records")


def build_table(reg: Registry, table: str) -> list[Path]:
    started = time.time()
    spec = reg.params["tables"][table]
    per_seed = tables.collect(reg, table)
    frame = tables.aggregate(reg, table, per_seed)
    outputs = {ext: paths.table(table, ext) for ext in ("csv", "md", "tex")}
    write_text(outputs["csv"], frame.to_csv(index=False))
    write_text(outputs["md"], tables.to_markdown(reg, table, frame))
    write_text(outputs["tex"], tables.to_latex(reg, table, frame))
    written = list(outputs.values())
    record = provenance.record(
        "table", inputs=tables.eval_inputs(reg, table), params={"profile": reg.profile_name, "table": spec},
        wall_time_s=time.time() - started,
        extra={"table": table, "selection": spec["selection"],
               "cells": _records(per_seed[["row", "benchmark", "direction", "metric", "seed", "status", "run_id",
                                           "epoch", "eval_file", "value"]]),
               "outputs": {str(p): provenance.file_sha256(p) for p in written}})
    record_path = paths.table(table, "provenance.json")
    write_json(record_path, record)
    return written + [record_path]


def build_caption_geometry_table(reg: Registry, table: str = "tableA1") -> list[Path]:
    """Table A1 from the benchmarks' caption statistics and their training-set sizes."""
    from hnclip.data.manifest import read_manifest
    from hnclip.report import geometry
    started = time.time()
    benchmarks = reg.params["benchmarks"]
    stats = geometry.load_stats(benchmarks)
    train_manifests = {b: reg.train_manifest(spec["train"]) for b, spec in benchmarks.items()}
    counts = {b: len(read_manifest(path, check_images=False)) for b, path in train_manifests.items()}
    frame = geometry.table_a1(stats, counts, {b: s["label"] for b, s in benchmarks.items()}, reg.profile_name,
                              train_sets={b: s["train"] for b, s in benchmarks.items()})
    written = geometry.write_table_a1(frame, reg.profile_name)
    record = provenance.record(
        "table", inputs={**{f"stats:{b}": paths.stats(b) for b in benchmarks},
                         **{f"train_manifest:{b}": p for b, p in train_manifests.items()}},
        params={"profile": reg.profile_name}, wall_time_s=time.time() - started,
        extra={"table": table, "outputs": {str(p): provenance.file_sha256(p) for p in written}})
    record_path = paths.table(table, "provenance.json")
    write_json(record_path, record)
    return written + [record_path]


def timing_runs(reg: Registry, table: str = "tableA3") -> dict[str, str | None]:
    """A timing table's rows -> the planned run (on its training set, first seed) whose training
    record gives its time; None for frameworks not implemented and for runs no table asks for."""
    spec = reg.params["derived_tables"][table]
    out = {}
    for row in spec["rows"]:
        recipe = reg.params["methods"][row["method"]]
        run_id = None
        if recipe["framework"] in TRAINED_FRAMEWORKS:
            run = reg.run_spec(spec["train"], recipe, reg.profile["seeds"][0], register=False)
            run_id = run.run_id if run.run_id in reg.runs() else None
        out[row["key"]] = run_id
    return out


def build_timing_table(reg: Registry, table: str = "tableA3") -> list[Path]:
    """Table A3: training wall-clock and images/s per method, read from the training records."""
    import pandas as pd

    from hnclip.io import read_json
    from hnclip.report.paper_reference import paper_table
    started = time.time()
    rows, inputs = [], {}
    spec = reg.params["derived_tables"][table]
    methods = {row["key"]: row["method"] for row in spec["rows"]}
    paper = paper_table(table).set_index(["row", "metric"])["value"]
    for row, run_id in timing_runs(reg, table).items():
        record = read_json(paths.run_record(run_id)) if run_id else None
        if record:
            inputs[row] = paths.run_record(run_id)
        measured = {"wall_clock_min": record["wall_time_s"] / 60 if record else None,
                    "throughput_img_s": record["images_per_second"] if record else None}
        implemented = reg.params["methods"][methods[row]]["framework"] in TRAINED_FRAMEWORKS
        status = "ok" if record else ("not planned by any table" if implemented else "not implemented yet")
        for metric, value in measured.items():
            rows.append({"table": table, "row": row, "metric": metric, "run_id": run_id, "status": status,
                         "ours": value, "paper": paper.get((row, metric)),
                         "device": record["device"]["type"] if record else None,
                         "resumed": bool(record and record.get("resumed_from_step"))})
    frame = pd.DataFrame(rows)
    outputs = {ext: paths.table(table, ext) for ext in ("csv", "md")}
    write_text(outputs["csv"], frame.to_csv(index=False))
    lines = [f"# {spec['title']} ({spec['train']}, {reg.profile_name} profile)", "",
             "Wall-clock of the training job and images/s over it (including per-epoch evaluation), from each "
             "run's training record. Different hardware from the paper's (Ascend 910B): compare ratios, not values.",
             "", "| method | wall-clock (min) | images/s | paper wall-clock (min) | paper images/s | device |",
             "|---|---|---|---|---|---|"]
    for row, group in frame.groupby("row", sort=False):
        get = group.set_index("metric")

        def fmt(value):
            return "n/i" if value is None or value != value else f"{value:.2f}"
        lines.append(f"| {row} | {fmt(get.loc['wall_clock_min', 'ours'])} | {fmt(get.loc['throughput_img_s', 'ours'])} "
                     f"| {fmt(get.loc['wall_clock_min', 'paper'])} | {fmt(get.loc['throughput_img_s', 'paper'])} "
                     f"| {get.iloc[0]['device'] if pd.notna(get.iloc[0]['device']) else '–'} |")
    write_text(outputs["md"], "\n".join(lines) + "\n")
    record = provenance.record("table", inputs=inputs, params={"profile": reg.profile_name},
                               wall_time_s=time.time() - started,
                               extra={"table": table, "cells": _records(frame),
                                      "outputs": {str(p): provenance.file_sha256(p) for p in outputs.values()}})
    record_path = paths.table(table, "provenance.json")
    write_json(record_path, record)
    return list(outputs.values()) + [record_path]
