"""`hnclip overlap`: perceptual-hash overlap between a training set and a test set."""
from __future__ import annotations

from hnclip.config import paths
from hnclip.config.registry import Registry


def overlap_report(reg: Registry, train: str, test: str, max_distance: int, drop: bool, workers: int | None) -> dict:
    """Write results/overlap/<train>__<test>.json (and, with `drop`, a filtered training manifest)."""
    from hnclip.data.overlap import check_overlap
    data_root = reg.profile["data_root"]
    out_manifest = paths.manifest(data_root, train, "train.dedup") if drop else None
    report = check_overlap(reg.train_manifest(train), paths.manifest(data_root, test, "test"),
                           paths.overlap_report(train, test), max_distance=max_distance,
                           out_manifest=out_manifest, workers=workers)
    return {**report, "report_path": str(paths.overlap_report(train, test)),
            "filtered_manifest": str(out_manifest) if out_manifest else None}
