"""Build one paper table (CSV, Markdown, LaTeX), its figure and its provenance record."""
from __future__ import annotations

import time
from pathlib import Path

from .. import paths, provenance
from ..io import write_json, write_text
from ..registry import Registry
from . import tables


def _records(frame) -> list[dict]:
    """Rows as JSON-safe dicts (missing values as null, not NaN)."""
    return frame.astype(object).where(frame.notna(), None).to_dict(orient="records")


def build_table(reg: Registry, table: str) -> list[Path]:
    started = time.time()
    spec = reg.params["tables"][table]
    per_seed = tables.collect(reg, table)
    frame = tables.aggregate(reg, table, per_seed)
    outputs = {ext: paths.table(table, ext) for ext in ("csv", "md", "tex")}
    frame.to_csv(outputs["csv"].with_suffix(".csv.part"), index=False)
    outputs["csv"].with_suffix(".csv.part").replace(outputs["csv"])
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


def build_caption_geometry_table(reg: Registry) -> list[Path]:
    """Table A1 from the benchmarks' caption statistics and their training-set sizes."""
    from ..data.manifest import read_manifest
    from . import geometry
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
        extra={"table": geometry.TABLE, "outputs": {str(p): provenance.file_sha256(p) for p in written}})
    record_path = paths.table(geometry.TABLE, "provenance.json")
    write_json(record_path, record)
    return written + [record_path]
