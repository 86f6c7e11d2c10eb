"""The rates `hnclip plan` turns images into hours with: the paper's own measurements (Appendix D.1,
Table A3) where it gives them, else a stated assumption, or those a throughput file measures."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hnclip.errors import UserError
from hnclip.io import read_jsonl


@dataclass(frozen=True)
class Rate:
    per_s: float    # images per second on one GPU (auxiliary_edges: one CPU process)
    source: str


_A3 = "paper Table A3 (DCI, 10 epochs, one Ascend 910B, effective batch 128)"
_PLAIN = "assumed equal to plain fine-tuning (Table A3's 55.5 img/s)"
# The default rates: the paper's own measurements where it gives them (Appendix D.1, Table A3), else a
# stated assumption. Rate classes: a run's framework, `full` split by whether it has the token term.
PAPER_RATES = {
    "plain": Rate(55.5, f"{_A3}: Long-CLIP (plain FT), 55.5 img/s"),
    "hnclip": Rate(53.0, f"{_A3}: HN-CLIP, 53 img/s (full-framework runs with the token term)"),
    "goal": Rate(22.0, f"{_A3}: GOAL, about 22 img/s (its released double forward included)"),
    "structxlip": Rate(10.0, f"{_A3}: StructXLIP, about 10 img/s"),
    "finelip": Rate(55.5, f"{_PLAIN}: Table A3 gives no FineLIP figure (it ran in parallel)"),
    "lora": Rate(55.5, f"{_PLAIN}: not in Table A3; adapters skip the weight gradients only"),
    "dora": Rate(55.5, f"{_PLAIN}: not in Table A3"),
    "evaluate": Rate(55.5, f"{_PLAIN}: a forward is about a third of a training step, but evaluation "
                           "encodes in fp32 (training: bf16 autocast)"),
    "segments": Rate(1 / 8.6, "assumed 8.6 s per image: SAM ViT-H automatic masks (32x32 points) take 8.35 s "
                              "on an A100 (meta-pytorch/segment-anything-fast#76; 5-6 s on an RTX 3090, "
                              "facebookresearch/segment-anything#61), plus 0.25 s of CLIP-L/14-336 matching"),
    "edges": Rate(10.0, "assumed: Canny maps of an image and its two top crops, PNG writes, one CPU process"),
}
PAPER_MODEL = "ViT-L-14-quickgelu"   # Long-CLIP-L's architecture: what the paper's rates were measured on
# With a rates file, a class it does not measure is its plain rate times the paper's ratio (auxiliary
# builds run other models: they keep the defaults above).
SCALED_FROM_PLAIN = ("hnclip", "goal", "structxlip", "finelip", "lora", "dora", "evaluate")


def rate_class(spec: dict) -> str:
    objective = spec["objective"]
    if objective["framework"] == "full":
        return "hnclip" if float(objective.get("lambda_tok", 0)) > 0 else "plain"
    return objective["framework"]


def read_rates(path: str | Path, mode: str) -> dict[str, Rate]:
    """The default rates with those a throughput file (benchmarks/throughput.py's JSON lines) measures.
    Per method the last line in the profile's `mode` (accumulate / compute_batch) wins, else the last
    line of any mode; a class it does not measure is its plain rate x the paper's ratio."""
    try:
        rows = read_jsonl(path)
    except FileNotFoundError:
        raise UserError(f"rates file {path} not found; write one with benchmarks/throughput.py") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"rates file {path}: not JSON lines ({exc})") from None
    chosen: dict[str, dict] = {}
    for row in rows:
        method = row.get("method")
        if method not in PAPER_RATES or not row.get("img_per_s"):
            continue
        previous = chosen.get(method)
        if previous is not None and previous.get("mode", mode) == mode and row.get("mode", mode) != mode:
            continue  # a line in the profile's mode is kept over a later one in another mode
        chosen[method] = row
    if not chosen:
        raise UserError(f"rates file {path}: no line has a `method` of {sorted(PAPER_RATES)} and an `img_per_s`")
    rates = dict(PAPER_RATES)
    for method, row in chosen.items():
        where = ", ".join(str(v) for v in (row.get("mode"), row.get("shapes", {}).get("model"),
                                           row.get("device_name") or row.get("device"),
                                           str(row.get("timestamp", ""))[:10]) if v)
        rates[method] = Rate(float(row["img_per_s"]), f"{path}: {method} ({where})")
    if "plain" in chosen:
        plain = rates["plain"].per_s
        for cls in SCALED_FROM_PLAIN:
            if cls not in chosen:
                ratio = PAPER_RATES[cls].per_s / PAPER_RATES["plain"].per_s
                rates[cls] = Rate(plain * ratio, f"{path}: plain x {ratio:.3g} (Table A3's {cls} / plain ratio)")
    return rates
