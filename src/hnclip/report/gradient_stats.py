"""Statistics of the gradient-dynamics figures (paper §2.4 / Fig. 4, Appendix C / Fig. A8), as pure
functions of a run's probe log (grad_probe.jsonl rows) and training record (train.json). The library
side of one concept at two layers: the command that reads the logs and writes results/stats/<figure>.json
(`hnclip gradient-stats`) is `hnclip.commands.gradient_stats`.

A probe row measures, on one training batch, both losses, the L2 norms of their full-parameter
gradients and their cosine (`hnclip.training.probe`). Definitions, as the paper uses them:

* saturated: a loss below `threshold` on that batch (the trainer's SATURATION_THRESHOLD, 1e-3, passed
  in by the caller so this module needs no torch); "active" is its complement.
* exactly zero: every entry of the fp32 gradient of L_CLIP is 0 (the probe's own flag).
* ratio ||grad L_HN|| / ||grad L_CLIP||: only on measurements where grad L_CLIP is nonzero.
* interquartile band: numpy's linear-interpolation 25th and 75th percentiles; two bands are disjoint
  when one's 25th percentile lies above the other's 75th.
* cosine: mean, sample SD (ddof 1) and median over the measurements where both gradients are
  nonzero (the probe writes null elsewhere); "positive" is cosine > 0.
* held-out retrieval error: 100 - R@1 (%) of the per-epoch evaluation, per direction.

Every statistic that has no measurement to stand on is None (JSON null), never 0.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

import numpy as np

from hnclip.config import paths

DIRECTIONS = ("t2i", "i2t")


def stats_path(figure: str) -> Path:
    """results/stats/<figure>.json: the statistics a gradient figure draws and quotes."""
    return paths.RESULTS / "stats" / f"{figure}.json"


def probe_log(run_id: str) -> Path:
    """The probe rows a probed run writes next to its training record."""
    return paths.run_dir(run_id) / "grad_probe.jsonl"


# ---- small helpers -------------------------------------------------------------------------------
def quartiles(values: Iterable[float]) -> dict:
    """{n, median, q25, q75} of the values (None where there are none)."""
    data = np.asarray(list(values), dtype=float)
    if data.size == 0:
        return {"n": 0, "median": None, "q25": None, "q75": None}
    q25, median, q75 = np.percentile(data, [25, 50, 75])
    return {"n": int(data.size), "median": float(median), "q25": float(q25), "q75": float(q75)}


def share(flags: Iterable[bool]) -> float | None:
    """Fraction of True among the flags; None for no flags."""
    data = [bool(f) for f in flags]
    return sum(data) / len(data) if data else None


def ratio(record: dict) -> float | None:
    """||grad L_HN|| / ||grad L_CLIP|| of one measurement; None where grad L_CLIP is exactly zero."""
    clip = record["clip_grad_norm"]
    return record["hn_grad_norm"] / clip if clip > 0 else None


def bands_disjoint(a: dict, b: dict) -> bool | None:
    """Whether two interquartile bands (as `quartiles` returns) do not overlap."""
    if a["n"] == 0 or b["n"] == 0:
        return None
    return a["q25"] > b["q75"] or b["q25"] > a["q75"]


def running_median(values: list[float], window: int) -> list[float]:
    """Centred running median over `window` measurements (shorter at the ends), for the thick
    traces of Fig. A8."""
    half = max(1, window) // 2
    return [float(np.median(values[max(0, i - half): i + half + 1])) for i in range(len(values))]


# ---- one run -------------------------------------------------------------------------------------
def cosine_statistics(records: list[dict]) -> dict:
    values = np.asarray([r["grad_cosine"] for r in records if r.get("grad_cosine") is not None], dtype=float)
    if values.size == 0:
        return {"n": 0, "mean": None, "sd": None, "median": None, "share_positive": None}
    return {"n": int(values.size), "mean": float(values.mean()),
            "sd": float(values.std(ddof=1)) if values.size > 1 else None,
            "median": float(np.median(values)), "share_positive": float((values > 0).mean())}


def epoch_statistics(records: list[dict], threshold: float) -> list[dict]:
    """Per epoch (1-based, as the probe rows record it): the saturation shares, the exact-zero
    share, and the quartiles of both gradient norms (zeros included) and of their ratio (nonzero
    grad L_CLIP only)."""
    out = []
    for epoch in sorted({r["epoch"] for r in records}):
        rows = [r for r in records if r["epoch"] == epoch]
        clip_norm = quartiles(r["clip_grad_norm"] for r in rows)
        hn_norm = quartiles(r["hn_grad_norm"] for r in rows)
        out.append({
            "epoch": epoch, "measurements": len(rows),
            "clip_saturated_share": share(r["clip_loss"] < threshold for r in rows),
            "hn_active_share": share(r["hn_loss"] >= threshold for r in rows),
            "clip_grad_exactly_zero_share": share(r["clip_grad_exactly_zero"] for r in rows),
            "clip_loss": quartiles(r["clip_loss"] for r in rows), "hn_loss": quartiles(r["hn_loss"] for r in rows),
            "clip_grad_norm": clip_norm, "hn_grad_norm": hn_norm,
            "norm_bands_disjoint": bands_disjoint(clip_norm, hn_norm),
            "ratio_nonzero": quartiles(v for v in map(ratio, rows) if v is not None),
        })
    return out


def _extreme(values: list[float | None], pick) -> float | None:
    present = [v for v in values if v is not None]
    return pick(present) if present else None


def measurement_summary(records: list[dict], threshold: float) -> dict:
    """The numbers §2.4 and Appendix C quote, for one run's probe rows."""
    epochs = epoch_statistics(records, threshold)
    later = [r for r in records if r["epoch"] > 1]
    ratios = [v for v in map(ratio, records) if v is not None]
    epoch_ratio = [e["ratio_nonzero"]["median"] for e in epochs]
    return {
        "measurements": len(records), "epochs": len(epochs),
        "epoch1_clip_saturated_share": share(r["clip_loss"] < threshold for r in records if r["epoch"] == 1),
        "clip_saturated_share": share(r["clip_loss"] < threshold for r in records),
        "clip_grad_exactly_zero_share": share(r["clip_grad_exactly_zero"] for r in records),
        "epochs_clip_median_grad_zero": sum(e["clip_grad_norm"]["median"] == 0 for e in epochs),
        "hn_active_share_min_epoch": _extreme([e["hn_active_share"] for e in epochs], min),
        "hn_active_share_after_epoch1": share(r["hn_loss"] >= threshold for r in later),
        "clip_active_share_after_epoch1": share(r["clip_loss"] >= threshold for r in later),
        "clip_grad_nonzero_share": share(r["clip_grad_norm"] > 0 for r in records),
        "ratio_nonzero": {**quartiles(ratios), "max": max(ratios) if ratios else None},
        "ratio_epoch_median_min": _extreme(epoch_ratio, min),
        "ratio_epoch_median_max": _extreme(epoch_ratio, max),
        "epochs_norm_bands_disjoint": sum(bool(e["norm_bands_disjoint"]) for e in epochs),
        "cosine": cosine_statistics(records),
    }


# Where "the gradient reaches exact zero in fp32" can come from (Table X1), each a share of the probed
# batches: the fp32 loss itself is 0; the gradient's norm computed in fp32 is 0 (squares underflow
# below ~1e-22 per entry); every fp32 gradient entry is 0; every gradient entry is 0 when the forward and
# the loss run under bf16 autocast. Probe rows that predate a measurement do not count for it.
EXACT_ZERO_MEASURES = {
    "zero_loss_fp32": lambda r: None if r.get("clip_loss") is None else r["clip_loss"] == 0.0,
    "zero_norm_fp32": lambda r: None if r.get("clip_grad_norm_fp32") is None else r["clip_grad_norm_fp32"] == 0.0,
    "zero_grad_fp32": lambda r: r.get("clip_grad_exactly_zero"),
    "zero_grad_bf16": lambda r: r.get("clip_bf16_grad_exactly_zero"),
}


def exact_zero_shares(records: list[dict]) -> dict:
    """{measure: (share of the probe rows that measured it, how many did)} for EXACT_ZERO_MEASURES;
    the share is None where no row measured it."""
    out = {}
    for name, flag in EXACT_ZERO_MEASURES.items():
        flags = [f for f in map(flag, records) if f is not None]
        out[name] = (share(flags), len(flags))
    return out


def retrieval_error(history: list[dict], initial: dict | None, benchmark: str) -> dict:
    """Held-out retrieval error (100 - R@1, %) per epoch and direction on one benchmark; epoch 0 is
    the initial backbone. `first`/`last` are epochs 1 and E; `monotone` says whether the error
    never rises from one epoch to the next after epoch 1."""
    rows = [{"epoch": h["epoch"], **{d: 100.0 - h["eval"][benchmark][d]["R@1"] for d in DIRECTIONS}}
            for h in sorted(history, key=lambda h: h["epoch"])]
    if initial is not None and benchmark in initial:
        rows.insert(0, {"epoch": 0, **{d: 100.0 - initial[benchmark][d]["R@1"] for d in DIRECTIONS}})
    trained = [row for row in rows if row["epoch"] > 0]
    summary = {d: {"first": trained[0][d] if trained else None, "last": trained[-1][d] if trained else None,
                   "monotone": all(b[d] <= a[d] for a, b in zip(trained, trained[1:])) if trained else None}
               for d in DIRECTIONS}
    return {"benchmark": benchmark, "per_epoch": rows, **summary}


def all_batch_saturation(history: list[dict]) -> list[dict]:
    """Per epoch, over every training micro-batch (not only the probed ones): the share with
    L_CLIP < 1e-3 and with L_HN >= 1e-3, from the training record's epoch summaries."""
    out = []
    for h in sorted(history, key=lambda h: h["epoch"]):
        train = h["train"]
        hn_saturated = train.get("hn_saturated_frac")
        out.append({"epoch": h["epoch"], "micro_batches": train["micro_batches"],
                    "clip_saturated_share": train.get("infonce_saturated_frac"),
                    "hn_active_share": None if hn_saturated is None else 1.0 - hn_saturated})
    return out


# ---- several runs (Fig. A8) ------------------------------------------------------------------------
def pooled_summary(runs: list[list[dict]]) -> dict:
    """Appendix C's numbers over several runs' probe rows: the share of measurements with a nonzero
    grad L_CLIP, the range of the per-run median and peak ratios, and the cosine pooled."""
    pooled = [r for records in runs for r in records]
    per_run = [[v for v in map(ratio, records) if v is not None] for records in runs]
    medians = [float(np.median(v)) for v in per_run if v]
    peaks = [max(v) for v in per_run if v]
    return {"runs": len(runs), "measurements": len(pooled),
            "clip_grad_nonzero_share": share(r["clip_grad_norm"] > 0 for r in pooled),
            "ratio_run_median_min": min(medians, default=None), "ratio_run_median_max": max(medians, default=None),
            "ratio_run_peak_min": min(peaks, default=None), "ratio_run_peak_max": max(peaks, default=None),
            "cosine": cosine_statistics(pooled)}


# ---- captions ------------------------------------------------------------------------------------
def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def number(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def magnitude(value: float | None) -> str:
    """A positive ratio with three significant digits and a times sign: '2.02×', '1.5e+05×'."""
    if value is None or value <= 0 or not math.isfinite(value):
        return "n/a"
    return f"{value:.3g}×"


def fig4_caption(run: dict, threshold: float) -> str:
    """One run's Fig. 4 sentence: every number it quotes is read from `run` (a `runs` entry of the
    statistics file) or is the saturation threshold."""
    s, error = run["summary"], run["retrieval"]
    last_epoch = max((row["epoch"] for row in error["per_epoch"]), default="n/a")
    forward = (run.get("precision") or {}).get("effective", "unknown")
    errors = "; ".join(f"{label} {number(error[d]['first'], 1)}% → {number(error[d]['last'], 1)}%"
                       + ("" if error[d]["monotone"] else " (not monotone)")
                       for d, label in (("t2i", "T→I"), ("i2t", "I→T")))
    return (f"{run['label']} (seed {run['seed']}, {count(s['measurements'], 'measurement')} over "
            f"{count(s['epochs'], 'epoch')}): "
            f"L_CLIP < {threshold:g} on {percent(s['epoch1_clip_saturated_share'])} of measured batches in epoch 1; "
            f"∇L_CLIP exactly zero in {percent(s['clip_grad_exactly_zero_share'])} of measurements "
            f"(fp32 gradient, {forward} forward; "
            f"per-epoch median zero at {count(s['epochs_clip_median_grad_zero'], 'epoch')}); "
            f"L_HN active on at least {percent(s['hn_active_share_min_epoch'])} of batches in every epoch and on "
            f"{percent(s['hn_active_share_after_epoch1'])} after epoch 1; "
            f"per-epoch median ratio ‖∇L_HN‖/‖∇L_CLIP‖ (where ∇L_CLIP ≠ 0) "
            f"{magnitude(s['ratio_epoch_median_min'])}–{magnitude(s['ratio_epoch_median_max'])}, "
            f"interquartile bands disjoint at {count(s['epochs_norm_bands_disjoint'], 'epoch')}; "
            f"cosine mean {number(s['cosine']['mean'])}, SD {number(s['cosine']['sd'])}; "
            f"held-out retrieval error epoch 1 → {last_epoch}: {errors}.")


def figa8_caption(pooled: dict) -> str:
    """Appendix C's sentence over all runs of Fig. A8, from the pooled statistics."""
    cosine = pooled["cosine"]
    return (f"{count(pooled['runs'], 'run')}, {count(pooled['measurements'], 'measurement')}: ∇L_CLIP nonzero in "
            f"{percent(pooled['clip_grad_nonzero_share'])}; on those, per-run median ratio "
            f"{magnitude(pooled['ratio_run_median_min'])}–{magnitude(pooled['ratio_run_median_max'])}, "
            f"peaks {magnitude(pooled['ratio_run_peak_min'])}–{magnitude(pooled['ratio_run_peak_max'])}; "
            f"median cosine {number(cosine['median'])}, positive on {percent(cosine['share_positive'])} "
            f"of measurements.")


def report_caption(figure: str) -> str:
    """The figure's statistics sentence as literal reStructuredText (the HTML report's caption);
    empty before its statistics file exists."""
    import json
    path = stats_path(figure)
    if not path.exists():
        return ""
    caption = json.loads(path.read_text(encoding="utf-8"))["caption"]
    return "".join("\\" + c if c in "\\*`|_" else c for c in caption)
