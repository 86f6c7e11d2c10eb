"""Probe statistics: measures of the gradient-probe records of a figure's runs (Figs. 4, A8), pooled
over the runs or one item per run (`per_run`), each as draws (estimate, then bootstrap replicates)."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from hnclip.report.effects import CellUnavailable, aligned


def _share(mask: np.ndarray) -> np.ndarray:
    return mask.mean(axis=-1)


def _ratios(records: list[dict], field: str, over: str) -> np.ndarray:
    return np.array([r[field] / r[over] for r in records if r[over] > 0])


def _probe_values(measure: str, spec: dict, records: list[dict]) -> tuple[np.ndarray, Callable]:
    """(per-record values, statistic of a [.., n] array of them) of one probe measure."""
    field = spec["field"]
    if measure in ("share_below", "share_at_least"):
        below = np.array([r[field] < spec["threshold"] for r in records], dtype=bool)
        return (below if measure == "share_below" else ~below).astype(float), _share
    if measure in ("share_true", "share_false"):
        return np.array([bool(r[field]) == (measure == "share_true") for r in records], dtype=float), _share
    if measure == "median_ratio":
        return _ratios(records, field, spec["over"]), lambda v: np.median(v, axis=-1)
    values = np.array([r[field] for r in records if r[field] is not None], dtype=float)
    reducers = {"mean": lambda v: v.mean(axis=-1), "median": lambda v: np.median(v, axis=-1),
                "share_positive": lambda v: _share(v > 0)}
    return values, reducers[measure]


# Measures taken within each epoch, then the smallest: measure -> (the per-epoch measure, "min")
PER_EPOCH_MEASURES = {"min_epoch_share_at_least": ("share_at_least", "min"),
                      "min_epoch_median_ratio": ("median_ratio", "min")}


def _probe_item(spec: dict, records: list[dict], unit: str, source) -> np.ndarray:
    """One item of a probe statistic over `records` (one run's, or all the figure's runs')."""
    measure = spec["measure"]
    if measure == "first_step_below":  # the first optimizer step whose probe falls below the threshold
        below = [r["step"] for r in sorted(records, key=lambda r: r["step"]) if r[spec["field"]] < spec["threshold"]]
        return np.array([float(below[0]) if below else math.inf])
    if measure == "max_log10_ratio":
        ratios = _ratios(records, spec["field"], spec["over"])
        if not len(ratios):
            raise CellUnavailable("no probe where the ratio's denominator is nonzero", unit)
        return np.array([math.log10(ratios.max())])
    if measure in PER_EPOCH_MEASURES:  # every epoch resampled within itself (stratified), then the smallest
        base, _ = PER_EPOCH_MEASURES[measure]
        per_epoch = []
        for epoch in sorted({r["epoch"] for r in records}):
            in_epoch = [r for r in records if r["epoch"] == epoch]
            if base == "share_at_least":
                values = np.array([r[spec["field"]] >= spec["threshold"] for r in in_epoch], dtype=float)
                statistic = _share
            else:
                values, statistic = _probe_values("median_ratio", spec, in_epoch)
            if len(values):
                per_epoch.append(source.resample(f"{unit}:epoch{epoch}", values, statistic))
        if not per_epoch:
            raise CellUnavailable("no probe records to measure", unit)
        return np.min(np.stack(aligned(*per_epoch)), axis=0)
    values, statistic = _probe_values(measure, spec, records)
    if not len(values):
        raise CellUnavailable(f"no probe records with a value for {spec['measure']}", unit)
    return source.resample(unit, values, statistic)


def probe_items(spec: dict, source) -> list[np.ndarray]:
    """Probe statistics: pooled over the figure's runs, or one item per run (`per_run`)."""
    records = source.probe(spec["figure"], spec.get("method"))
    unit = f"probe:{spec['figure']}:{spec.get('method')}"
    if "epoch" in spec:
        records = [r for r in records if r["epoch"] == spec["epoch"]]
    if "from_epoch_fraction" in spec:  # the epochs after this fraction of training, e.g. 0.5: 6-10 of 10
        last = max(r["epoch"] for r in records)
        records = [r for r in records if r["epoch"] > spec["from_epoch_fraction"] * last]
    if not records:
        raise CellUnavailable("no probe records in the epochs it measures", spec["figure"])
    if not spec.get("per_run"):
        return [_probe_item(spec, records, unit, source)]
    runs = sorted({r.get("run") for r in records})
    return [_probe_item(spec, [r for r in records if r.get("run") == run], f"{unit}:{run}", source) for run in runs]


