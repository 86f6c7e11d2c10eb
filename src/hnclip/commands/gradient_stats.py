"""`hnclip gradient-stats`: the statistics a gradient-dynamics figure (Fig. 4, Fig. A8) quotes,
computed from its runs' probe logs and training records into results/stats/<figure>.json (with
provenance); the figure draws its bands and its caption from this file. The command of one concept at
two layers: the statistics themselves are computed by `hnclip.report.gradient_stats`."""
from __future__ import annotations

import time
from pathlib import Path

from hnclip import provenance
from hnclip.config import paths
from hnclip.config.registry import GRADIENT_FIGURE_KINDS, Registry
from hnclip.errors import UnknownNameError, UserError
from hnclip.io import read_json, read_jsonl, write_json
from hnclip.report import gradient_stats as gs


def figure_runs(reg: Registry, spec: dict) -> list[dict]:
    """The (run, benchmark) pairs a gradient figure draws, with their curve label, method, seed and
    training fraction, in the figure's series order."""
    methods, benchmarks = reg.params["methods"], reg.params["benchmarks"]
    runs, seen = [], set()
    for label, cells in reg.figure_series(spec).items():
        for cell in cells:
            if (cell.run_id, cell.benchmark) in seen:
                continue
            seen.add((cell.run_id, cell.benchmark))
            runs.append({"run_id": cell.run_id, "label": label, "row": cell.row, "method": cell.method,
                         "method_label": methods[cell.method]["label"], "benchmark": cell.benchmark,
                         "benchmark_label": benchmarks[cell.benchmark]["label"], "train_set": cell.train_set,
                         "seed": cell.seed, "fraction": float(dict(cell.settings).get("fraction", 1.0))})
    return runs


def _probe_log(run_id: str) -> Path:
    path = gs.probe_log(run_id)
    if not path.exists():
        raise UserError(f"{path} is missing: run {run_id} was trained without the gradient probe "
                        f"(execution.grad_probe_every is 0, or the run predates the figure); retrain it")
    return path


def run_statistics(run: dict, records: list[dict], train_record: dict, threshold: float) -> dict:
    """One run's entry of the statistics file."""
    history, training = train_record["history"], train_record.get("training", {})
    return {**run, "precision": training.get("precision"), "probe": training.get("grad_probe"),
            "summary": gs.measurement_summary(records, threshold),
            "per_epoch": gs.epoch_statistics(records, threshold),
            "all_batches": gs.all_batch_saturation(history),
            "retrieval": gs.retrieval_error(history, train_record.get("initial_eval"), run["benchmark"])}


def gradient_statistics(reg: Registry, figure: str) -> Path:
    """Write and return results/stats/<figure>.json."""
    from hnclip.training.step import SATURATION_THRESHOLD
    started = time.time()
    spec = reg.params["figures"].get(figure)
    if spec is None or spec["kind"] not in GRADIENT_FIGURE_KINDS:
        names = sorted(n for n, s in reg.params["figures"].items() if s["kind"] in GRADIENT_FIGURE_KINDS)
        raise UnknownNameError(f"{figure!r} is not a gradient-dynamics figure; allowed values: {names}")
    runs, traces, inputs = [], [], {}
    for run in figure_runs(reg, spec):
        probe_path, record_path = _probe_log(run["run_id"]), paths.run_record(run["run_id"])
        inputs[f"grad_probe:{run['run_id']}"], inputs[f"train_record:{run['run_id']}"] = probe_path, record_path
        traces.append(read_jsonl(probe_path))
        entry = run_statistics(run, traces[-1], read_json(record_path), SATURATION_THRESHOLD)
        if spec["kind"] == "gradient_dynamics":
            entry["caption"] = gs.fig4_caption(entry, SATURATION_THRESHOLD)
        runs.append(entry)
    result = {"figure": figure, "kind": spec["kind"], "profile": reg.profile_name,
              "saturation_threshold": SATURATION_THRESHOLD, "runs": runs}
    if spec["kind"] == "gradient_dynamics":
        result["caption"] = " ".join(run["caption"] for run in runs) or "No probed run."
    else:
        result["pooled"] = gs.pooled_summary(traces)
        result["caption"] = gs.figa8_caption(result["pooled"])
    result["provenance"] = provenance.record("stats", inputs=inputs, params={"figure": spec},
                                             wall_time_s=time.time() - started)
    out = gs.stats_path(figure)
    write_json(out, result)
    return out
