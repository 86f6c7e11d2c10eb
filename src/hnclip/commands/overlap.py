"""`hnclip overlap`: perceptual-hash overlap between a training set and a test set. The command of one
concept at two layers: the library side that hashes and compares is `hnclip.data.overlap`."""
from __future__ import annotations

import time
from pathlib import Path

from hnclip import provenance
from hnclip.config import paths
from hnclip.config.registry import Registry
from hnclip.data.overlap import (
    DEFAULT_HASH_SIZE,
    DEFAULT_MAX_DISTANCE,
    DEFAULT_METHOD,
    drop_overlaps,
    find_overlaps,
)
from hnclip.data.overlap import (
    overlap_report as pair_report,
)
from hnclip.io import write_json


def overlap_report(reg: Registry, train: str, test: str, max_distance: int, drop: bool, workers: int | None) -> dict:
    """Write results/overlap/<train>__<test>.json (and, with `drop`, a filtered training manifest)."""
    data_root = reg.profile["data_root"]
    out_manifest = paths.manifest(data_root, train, "train.dedup") if drop else None
    report = check_overlap(reg.train_manifest(train), paths.manifest(data_root, test, "test"),
                           paths.overlap_report(train, test), max_distance=max_distance,
                           out_manifest=out_manifest, workers=workers)
    return {**report, "report_path": str(paths.overlap_report(train, test)),
            "filtered_manifest": str(out_manifest) if out_manifest else None}


def check_overlap(train_manifest: str | Path, test_manifest: str | Path, report_path: str | Path,
                  max_distance: int = DEFAULT_MAX_DISTANCE, method: str = DEFAULT_METHOD,
                  hash_size: int = DEFAULT_HASH_SIZE, out_manifest: str | Path | None = None,
                  workers: int | None = None) -> dict:
    """The whole check for the CLI: find pairs, optionally write the filtered training manifest, and
    write the report (with provenance) to `report_path`. Returns the report."""
    started = time.time()
    overlaps = find_overlaps(train_manifest, test_manifest, max_distance, method, hash_size, workers)
    report = pair_report(train_manifest, test_manifest, overlaps, max_distance, method, hash_size)
    if out_manifest is not None:
        kept = drop_overlaps(train_manifest, overlaps, out_manifest)
        report.update(out_manifest=str(out_manifest), n_kept=len(kept))
    report["provenance"] = provenance.record(
        "overlap", inputs={"train_manifest": train_manifest, "test_manifest": test_manifest},
        params={"max_distance": max_distance, "method": method, "hash_size": hash_size},
        wall_time_s=time.time() - started)
    write_json(report_path, report)
    return report
