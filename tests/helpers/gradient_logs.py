"""Hand-made gradient-probe logs and training records (answers worked out by hand in
test_gradient_stats.py), and a project holding them for the committed params' gradient figures."""
from __future__ import annotations

from hnclip.config import paths
from hnclip.config.registry import Registry
from hnclip.io import write_json, write_jsonl
from hnclip.report import gradient_stats as gs


def probe_row(step, epoch, clip_loss, hn_loss, clip_norm, hn_norm, cosine) -> dict:
    """A grad_probe.jsonl row with the fields the statistics read (as `GradientProbe.measure` writes)."""
    return {"step": step, "epoch": epoch, "clip_loss": clip_loss, "hn_loss": hn_loss, "clip_grad_norm": clip_norm,
            "hn_grad_norm": hn_norm, "grad_cosine": cosine, "clip_grad_exactly_zero": clip_norm == 0,
            "hn_grad_exactly_zero": hn_norm == 0}


# Epoch 1: two of three nonzero-gradient batches saturated, one exact zero; epoch 2: mostly exact zeros.
RECORDS = [
    probe_row(0, 1, 0.5, 2.0, 1.0, 10.0, 0.5),
    probe_row(1, 1, 1e-4, 1.0, 0.01, 5.0, 0.9),
    probe_row(2, 1, 0.0, 0.5, 0.0, 4.0, None),
    probe_row(3, 1, 2e-4, 1e-4, 0.001, 0.1, -0.1),
    probe_row(4, 2, 0.0, 0.2, 0.0, 2.0, None),
    probe_row(5, 2, 0.0, 5e-4, 0.0, 0.0, None),
    probe_row(6, 2, 1e-5, 0.3, 1e-4, 1.0, 0.3),
    probe_row(7, 2, 0.0, 0.0, 0.0, 0.0, None),
]


def metrics(t2i: float, i2t: float, benchmark: str = "docci") -> dict:
    return {benchmark: {"t2i": {"R@1": t2i}, "i2t": {"R@1": i2t}}}


HISTORY = [{"epoch": e, "eval": metrics(t2i, i2t),
            "train": {"micro_batches": 8, "infonce_saturated_frac": sat, "hn_saturated_frac": hn_sat}}
           for e, t2i, i2t, sat, hn_sat in ((1, 80.0, 70.0, 0.25, 0.125), (2, 82.0, 75.0, 0.5, 0.25),
                                            (3, 81.0, 78.0, 1.0, 0.5))]
INITIAL = metrics(60.0, 55.0)


# ---- one run ----------------------------------------------------------------------------------------


def write_probed_project(reg: Registry, params: dict) -> Registry:
    """The committed params' Fig. 4 and Fig. A8 runs with these probe logs and training records, in
    the current directory."""
    from hnclip.commands.gradient_stats import figure_runs
    for figure in ("fig4_gradient_dynamics", "figA8_gradient_dynamics_scales"):
        for run in figure_runs(reg, params["figures"][figure]):
            write_jsonl(gs.probe_log(run["run_id"]), RECORDS)
            history = [{**h, "eval": metrics(h["eval"]["docci"]["t2i"]["R@1"], h["eval"]["docci"]["i2t"]["R@1"],
                                             run["benchmark"])} for h in HISTORY]
            write_json(paths.run_record(run["run_id"]), {
                "history": history, "initial_eval": metrics(60.0, 55.0, run["benchmark"]),
                "training": {"precision": {"requested": "fp32", "effective": "fp32"}, "grad_probe": {"every": 1}}})
    return reg
