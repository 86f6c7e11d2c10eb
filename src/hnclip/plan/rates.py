"""The rates `hnclip plan` turns images into hours with: the paper's own measurements (Appendix D.1,
Table A3) where it gives them, else a stated assumption, or those a throughput file measures.

Every rate says what it is (`Rate.kind`): measured (a throughput file's row, with its device), paper
(Table A3), assumed (nobody measured it), or scaled (a measured rate times a stated ratio: only from a
row of the same framework family and the same mode, i.e. the same pairs per forward).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hnclip.config.constants import BASELINE_FRAMEWORKS
from hnclip.errors import UserError
from hnclip.io import read_jsonl

MEASURED, PAPER, ASSUMED, SCALED = "measured", "paper", "assumed", "scaled"


@dataclass(frozen=True)
class Rate:
    per_s: float    # images per second on one GPU (auxiliary_edges, gathers: one CPU process)
    source: str
    kind: str = PAPER   # measured / paper / assumed / scaled


_A3 = "paper Table A3 (DCI, 10 epochs, one Ascend 910B, effective batch 128)"
_PLAIN = "assumed equal to plain fine-tuning (Table A3's 55.5 img/s)"
# The default rates: the paper's own measurements where it gives them (Appendix D.1, Table A3), else a
# stated assumption. Rate classes: a run's framework, `full` split by whether it has the token term.
PAPER_RATES = {
    "plain": Rate(55.5, f"{_A3}: Long-CLIP (plain FT), 55.5 img/s"),
    "hnclip": Rate(53.0, f"{_A3}: HN-CLIP, 53 img/s (full-framework runs with the token term)"),
    "goal": Rate(22.0, f"{_A3}: GOAL, about 22 img/s (its released double forward included)"),
    "structxlip": Rate(10.0, f"{_A3}: StructXLIP, about 10 img/s"),
    "finelip": Rate(55.5, f"{_PLAIN}: Table A3 gives no FineLIP figure (it ran in parallel)", ASSUMED),
    "lora": Rate(55.5, f"{_PLAIN}: not in Table A3; adapters skip the weight gradients only", ASSUMED),
    "dora": Rate(55.5, f"{_PLAIN}: not in Table A3", ASSUMED),
    "evaluate": Rate(55.5, f"{_PLAIN}: a forward is about a third of a training step, but evaluation "
                           "encodes in fp32 (training: bf16 autocast)", ASSUMED),
    "segments": Rate(1 / 8.6, "assumed 8.6 s per image: SAM ViT-H automatic masks (32x32 points) take 8.35 s "
                              "on an A100 (meta-pytorch/segment-anything-fast#76; 5-6 s on an RTX 3090, "
                              "facebookresearch/segment-anything#61), plus 0.25 s of CLIP-L/14-336 matching",
                     ASSUMED),
    "edges": Rate(10.0, "assumed: Canny maps of an image and its two top crops, PNG writes, one CPU process",
                  ASSUMED),
    # the embedded backbone (hnclip-tiny-w128, batch 64) on 2 CPUs shared with other jobs, PASSIVE wait
    "pretrain": Rate(64 / 2.19, "benchmarks/results/pretrain_wait_policy.jsonl (2026-12-02): 2.19 s per step of 64 "
                                "images, tiny_pretrained on 2 busy CPUs (the embedded profiles' own backbone)",
                     MEASURED),
    "gather": Rate(1000.0, "assumed: concatenating a build's shard files, one CPU process (seconds)", ASSUMED),
}
PAPER_MODEL = "ViT-L-14-quickgelu"   # Long-CLIP-L's architecture: what the paper's rates were measured on
# The framework each training rate class runs: a rates file's row counts for a class only when it is that
# class's own method and framework (`framework` field), so no baseline is priced from another one's row.
CLASS_FRAMEWORK = {"plain": "full", "hnclip": "full", "lora": "lora", "dora": "dora",
                   "goal": "goal", "structxlip": "structxlip", "finelip": "finelip"}
# With a rates file, a class of the HN-CLIP objective it does not measure is plain's rate (same mode: the
# same pairs per forward) times the paper's ratio. Baselines are never scaled: their own row or the
# paper's rate. Evaluation: its own row (mode or method `evaluate`), else plain's rate (same mode) x 1.
SCALED_FROM_PLAIN = ("hnclip", "lora", "dora", "evaluate")
EVALUATE = "evaluate"
# The auxiliary benchmark's implementation paths (H2's benchmarks/auxiliary_throughput.py): `new` is what
# `hnclip auxiliary segments` runs, `today` the earlier crop-writing path; a file with only `today` rows
# still prices the segments (labelled so).
AUXILIARY_PATHS = ("new", "today")


def rate_class(spec: dict) -> str:
    objective = spec["objective"]
    if objective["framework"] == "full":
        return "hnclip" if float(objective.get("lambda_tok", 0)) > 0 else "plain"
    return objective["framework"]


def class_mode(cls: str, mode: str) -> str:
    """The mode a rate class runs in: the baselines take their released micro-batch of 16 pairs per
    forward (`accumulate`) whatever the profile's compute_batch; the HN-CLIP objective the profile's mode."""
    return "accumulate" if cls in BASELINE_FRAMEWORKS else mode


def _row_class(row: dict) -> str | None:
    """The rate class a throughput row measures, or None. Evaluation: method or mode `evaluate`."""
    if EVALUATE in (row.get("method"), row.get("mode")):
        return EVALUATE
    method = row.get("method")
    if method not in CLASS_FRAMEWORK:
        return None
    framework = row.get("framework", CLASS_FRAMEWORK[method])
    return method if framework == CLASS_FRAMEWORK[method] else None


def _where(path: str | Path, row: dict) -> str:
    return ", ".join(str(v) for v in (row.get("mode"), row.get("precision"), row.get("shapes", {}).get("model"),
                                      row.get("device_name") or row.get("device"),
                                      str(row.get("timestamp", ""))[:10]) if v)


def _read(path: str | Path, what: str, writer: str) -> list[dict]:
    try:
        return read_jsonl(path)
    except FileNotFoundError:
        raise UserError(f"{what} file {path} not found; write one with {writer}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{what} file {path}: not JSON lines ({exc})") from None


def read_rates(path: str | Path, mode: str, model: str | None = None) -> dict[str, Rate]:
    """The default rates with those a throughput file (benchmarks/throughput.py's JSON lines) measures.
    Each class takes the last row of its own method and framework in the mode it runs in (`class_mode`);
    a class of the HN-CLIP objective without one is plain's rate in the same mode x the paper's ratio;
    a baseline without one keeps the paper's rate. With `model` (the profile's architecture), rows
    measured at other shapes (a row's `shapes.model`, e.g. the benchmark's small CPU shapes) are left out:
    a tiny model's rate prices nothing of a ViT-L run."""
    rows = _read(path, "rates", "benchmarks/throughput.py")
    if model is not None:
        other = {row.get("shapes", {}).get("model") for row in rows} - {model, None}
        rows = [row for row in rows if row.get("shapes", {}).get("model") in (model, None)]
        if not rows:
            raise UserError(f"rates file {path}: every line was measured on another model ({sorted(other)}), "
                            f"none on this profile's {model}; measure it with benchmarks/throughput.py")
    chosen: dict[str, dict] = {}
    for row in rows:
        cls = _row_class(row)
        # a row without a mode (an older file) counts for the mode its class runs in
        if cls and row.get("img_per_s") and (cls == EVALUATE or row.get("mode", class_mode(cls, mode)) ==
                                             class_mode(cls, mode)):
            chosen[cls] = row
    if not chosen:
        raise UserError(f"rates file {path}: no line has a `method` of {sorted(CLASS_FRAMEWORK)} (or `evaluate`) "
                        f"in the mode it runs in ({mode}; baselines: accumulate) and an `img_per_s`")
    rates = dict(PAPER_RATES)
    for cls, row in chosen.items():
        rates[cls] = Rate(float(row["img_per_s"]), f"{path}: {cls} ({_where(path, row)})", MEASURED)
    if "plain" in chosen:
        plain = rates["plain"].per_s
        for cls in SCALED_FROM_PLAIN:
            if cls not in chosen:
                ratio = PAPER_RATES[cls].per_s / PAPER_RATES["plain"].per_s
                rates[cls] = Rate(plain * ratio, f"{path}: scaled from plain's {mode} row x {ratio:.3g} "
                                                 f"(Table A3's {cls} / plain ratio; not measured)", SCALED)
    for cls in BASELINE_FRAMEWORKS:
        if cls in rates and cls not in chosen:
            old = rates[cls]
            rates[cls] = Rate(old.per_s, f"not in {path} (no accumulate row of its own): {old.source}", old.kind)
    return rates


def read_auxiliary_rates(path: str | Path) -> dict[str, Rate]:
    """Measured segment rates (H2's benchmarks/results/auxiliary_throughput.jsonl rows: `path`,
    `dataset_size`, `s_per_image`, `device_name`): `segments/<dataset>` per dataset size measured, and
    `segments` from the largest one measured (the longest images: the safe side). The `new` path's rows
    are preferred over `today`'s; within one, the last row wins."""
    rows = [row for row in _read(path, "auxiliary rates", "benchmarks/auxiliary_throughput.py")
            if row.get("benchmark") == "auxiliary_throughput" and row.get("s_per_image")]
    if not rows:
        raise UserError(f"auxiliary rates file {path}: no `auxiliary_throughput` line with an `s_per_image`")
    def rank(row: dict) -> int:
        return AUXILIARY_PATHS.index(row["path"]) if row.get("path") in AUXILIARY_PATHS else len(AUXILIARY_PATHS)
    best: dict[str, dict] = {}
    for row in rows:
        size = str(row.get("dataset_size", ""))
        if size not in best or rank(row) <= rank(best[size]):
            best[size] = row
    rates = {}
    for size, row in best.items():
        where = ", ".join(str(v) for v in (f"path {row.get('path')}", row.get("megapixels") and
                                           f"{row['megapixels']} MP", row.get("device_name") or row.get("device"),
                                           str(row.get("timestamp", ""))[:10]) if v)
        rates[f"segments/{size}" if size else "segments"] = Rate(
            1 / float(row["s_per_image"]), f"{path}: {float(row['s_per_image']):.3g} s per image ({where})", MEASURED)
    if "segments" not in rates:
        slowest = min(rates, key=lambda name: rates[name].per_s)
        rates["segments"] = Rate(rates[slowest].per_s, f"{rates[slowest].source}; the slowest size measured "
                                                       f"({slowest.split('/')[1]}), for the others", MEASURED)
    return rates
