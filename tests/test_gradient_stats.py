"""Gradient-dynamics statistics (paper §2.4 / Fig. 4, Appendix C / Fig. A8) on hand-made probe logs
whose answers are worked out by hand, and the `hnclip gradient-stats` step that writes them."""
from __future__ import annotations

import json

import pytest
from helpers.gradient_logs import HISTORY, INITIAL, RECORDS, probe_row

from hnclip.config import paths
from hnclip.io import write_json
from hnclip.report import gradient_stats as gs

THRESHOLD = 1e-3


def test_measurement_summary_matches_the_hand_computed_answers():
    s = gs.measurement_summary(RECORDS, THRESHOLD)
    assert s["measurements"] == 8 and s["epochs"] == 2
    assert s["epoch1_clip_saturated_share"] == 0.75            # 1e-4, 0, 2e-4 of 0.5, 1e-4, 0, 2e-4
    assert s["clip_saturated_share"] == 7 / 8
    assert s["clip_grad_exactly_zero_share"] == 0.5            # steps 2, 4, 5, 7
    assert s["clip_grad_nonzero_share"] == 0.5
    assert s["epochs_clip_median_grad_zero"] == 1             # epoch 2: median of (0, 0, 1e-4, 0)
    assert s["hn_active_share_min_epoch"] == 0.5              # epoch 1: 3/4, epoch 2: 2/4
    assert s["hn_active_share_after_epoch1"] == 0.5
    assert s["clip_active_share_after_epoch1"] == 0.0
    # ratios where grad L_CLIP != 0: 10, 500, 100 (epoch 1) and 10000 (epoch 2)
    assert s["ratio_nonzero"] == {"n": 4, "median": pytest.approx(300.0), "q25": pytest.approx(77.5),
                                  "q75": pytest.approx(2875.0), "max": pytest.approx(10000.0)}
    assert s["ratio_epoch_median_min"] == pytest.approx(100.0)
    assert s["ratio_epoch_median_max"] == pytest.approx(10000.0)
    # epoch 1: hn IQR [3.025, 6.25] above clip IQR [0.00075, 0.2575]; epoch 2: hn IQR [0, 1.25]
    # overlaps clip IQR [0, 2.5e-5]
    assert s["epochs_norm_bands_disjoint"] == 1
    cosine = s["cosine"]                                        # 0.5, 0.9, -0.1, 0.3
    assert cosine["n"] == 4 and cosine["mean"] == pytest.approx(0.4)
    assert cosine["sd"] == pytest.approx((0.52 / 3) ** 0.5)
    assert cosine["median"] == pytest.approx(0.4) and cosine["share_positive"] == 0.75


def test_epoch_statistics_give_bands_per_epoch():
    first, second = gs.epoch_statistics(RECORDS, THRESHOLD)
    assert (first["epoch"], first["measurements"], second["epoch"]) == (1, 4, 2)
    assert first["clip_grad_norm"] == {"n": 4, "median": pytest.approx(0.0055), "q25": pytest.approx(0.00075),
                                       "q75": pytest.approx(0.2575)}
    assert first["hn_grad_norm"]["q25"] == pytest.approx(3.025) and first["hn_grad_norm"]["q75"] == pytest.approx(6.25)
    assert first["norm_bands_disjoint"] is True and second["norm_bands_disjoint"] is False
    assert first["ratio_nonzero"]["median"] == pytest.approx(100.0) and first["ratio_nonzero"]["n"] == 3
    assert second["ratio_nonzero"] == {"n": 1, "median": 10000.0, "q25": 10000.0, "q75": 10000.0}
    assert (first["clip_saturated_share"], first["hn_active_share"]) == (0.75, 0.75)
    assert (second["clip_grad_exactly_zero_share"], second["hn_active_share"]) == (0.75, 0.5)


def test_bands_that_touch_are_not_disjoint():
    def band(q25, q75):
        return {"n": 3, "q25": q25, "q75": q75}
    assert gs.bands_disjoint(band(1, 2), band(2.5, 3)) is True
    assert gs.bands_disjoint(band(2.5, 3), band(1, 2)) is True
    assert gs.bands_disjoint(band(1, 2), band(2, 3)) is False          # they share the value 2
    assert gs.bands_disjoint(band(1, 2), {"n": 0}) is None


def test_statistics_without_measurements_are_null_not_zero():
    only_zero = [probe_row(0, 1, 0.0, 0.0, 0.0, 0.0, None)]
    s = gs.measurement_summary(only_zero, THRESHOLD)
    assert s["ratio_nonzero"]["median"] is None and s["ratio_epoch_median_min"] is None
    assert s["cosine"] == {"n": 0, "mean": None, "sd": None, "median": None, "share_positive": None}
    assert s["hn_active_share_after_epoch1"] is None          # there is no epoch 2
    assert gs.measurement_summary([], THRESHOLD)["epoch1_clip_saturated_share"] is None


def test_retrieval_error_per_epoch_and_direction():
    error = gs.retrieval_error(HISTORY, INITIAL, "docci")
    assert error["per_epoch"] == [{"epoch": 0, "t2i": 40.0, "i2t": 45.0}, {"epoch": 1, "t2i": 20.0, "i2t": 30.0},
                                  {"epoch": 2, "t2i": 18.0, "i2t": 25.0}, {"epoch": 3, "t2i": 19.0, "i2t": 22.0}]
    assert error["t2i"] == {"first": 20.0, "last": 19.0, "monotone": False}   # 20 -> 18 -> 19
    assert error["i2t"] == {"first": 30.0, "last": 22.0, "monotone": True}


def test_all_batch_saturation_reads_the_epoch_summaries():
    rows = gs.all_batch_saturation(HISTORY)
    assert [(r["epoch"], r["clip_saturated_share"], r["hn_active_share"]) for r in rows] == \
        [(1, 0.25, 0.875), (2, 0.5, 0.75), (3, 1.0, 0.5)]


def test_running_median_is_centred_and_shorter_at_the_ends():
    assert gs.running_median([1, 100, 2, 3, 50], 3) == [50.5, 2.0, 3.0, 3.0, 26.5]


# ---- several runs (Fig. A8) ------------------------------------------------------------------------
def test_pooled_summary_over_runs():
    other = [probe_row(0, 1, 0.1, 1.0, 2.0, 2000.0, 0.7)]
    pooled = gs.pooled_summary([RECORDS, other])
    assert (pooled["runs"], pooled["measurements"]) == (2, 9)
    assert pooled["clip_grad_nonzero_share"] == pytest.approx(5 / 9)
    assert (pooled["ratio_run_median_min"], pooled["ratio_run_median_max"]) == (pytest.approx(300.0), 1000.0)
    assert (pooled["ratio_run_peak_min"], pooled["ratio_run_peak_max"]) == (1000.0, 10000.0)
    assert pooled["cosine"]["median"] == pytest.approx(0.5) and pooled["cosine"]["share_positive"] == 0.8


# ---- captions quote the computed numbers -----------------------------------------------------------
def _run_entry() -> dict:
    return {"label": "HN-CLIP", "seed": 42, "precision": {"effective": "bf16"},
            "summary": gs.measurement_summary(RECORDS, THRESHOLD), "retrieval": gs.retrieval_error(HISTORY, INITIAL,
                                                                                                  "docci")}


def test_fig4_caption_quotes_the_statistics():
    caption = gs.fig4_caption(_run_entry(), THRESHOLD)
    for text in ("8 measurements over 2 epochs", "L_CLIP < 0.001 on 75% of measured batches in epoch 1",
                 "exactly zero in 50% of measurements", "bf16 forward", "median zero at 1 epoch)",
                 "at least 50% of batches in every epoch", "100×–1e+04×", "disjoint at 1 epoch;",
                 "cosine mean 0.40, SD 0.42", "epoch 1 → 3: T→I 20.0% → 19.0% (not monotone); I→T 30.0% → 22.0%."):
        assert text in caption


def test_figa8_caption_quotes_the_pooled_statistics():
    caption = gs.figa8_caption(gs.pooled_summary([RECORDS]))
    assert caption == ("1 run, 8 measurements: ∇L_CLIP nonzero in 50%; on those, per-run median ratio "
                       "300×–300×, peaks 1e+04×–1e+04×; median cosine 0.40, positive on 75% of measurements.")


# ---- the step ------------------------------------------------------------------------------------------
def test_step_writes_fig4_statistics_with_provenance(probed_project):
    from hnclip.commands.gradient_stats import gradient_statistics
    out = gradient_statistics(probed_project, "fig4_gradient_dynamics")
    assert out == paths.RESULTS / "stats" / "fig4_gradient_dynamics.json"
    stats = json.loads(out.read_text())
    assert stats["saturation_threshold"] == THRESHOLD and stats["kind"] == "gradient_dynamics"
    (run,) = stats["runs"]
    assert (run["label"], run["benchmark"], run["seed"], run["fraction"]) == ("HN-CLIP", "docci", 42, 1.0)
    assert run["summary"] == json.loads(json.dumps(gs.measurement_summary(RECORDS, THRESHOLD)))
    assert run["retrieval"]["t2i"] == {"first": 20.0, "last": 19.0, "monotone": False}
    assert run["all_batches"][0] == {"epoch": 1, "micro_batches": 8, "clip_saturated_share": 0.25,
                                     "hn_active_share": 0.875}
    assert stats["caption"] == run["caption"] == gs.fig4_caption(run, THRESHOLD)
    inputs = stats["provenance"]["inputs"]
    assert set(inputs) == {f"grad_probe:{run['run_id']}", f"train_record:{run['run_id']}"}
    assert all(len(entry["sha256"]) == 64 for entry in inputs.values())


def test_step_pools_the_figa8_runs(probed_project):
    from hnclip.commands.gradient_stats import gradient_statistics
    stats = json.loads(gradient_statistics(probed_project, "figA8_gradient_dynamics_scales").read_text())
    runs = stats["runs"]
    assert {(r["benchmark"], r["fraction"]) for r in runs if r["method"] == "hn_clip"} == \
        {(b, f) for b in ("docci", "dci") for f in (0.05, 0.2, 0.5, 1.0)}
    assert stats["pooled"] == json.loads(json.dumps(gs.pooled_summary([RECORDS] * len(runs))))
    assert stats["caption"] == gs.figa8_caption(stats["pooled"])


def test_step_names_a_run_trained_without_the_probe(probed_project):
    from hnclip.commands.gradient_stats import figure_runs, gradient_statistics
    from hnclip.errors import UserError
    run = figure_runs(probed_project, probed_project.params["figures"]["fig4_gradient_dynamics"])[0]
    gs.probe_log(run["run_id"]).unlink()
    with pytest.raises(UserError, match=run["run_id"]):
        gradient_statistics(probed_project, "fig4_gradient_dynamics")


def test_step_rejects_a_figure_that_is_not_a_gradient_figure(probed_project):
    from hnclip.commands.gradient_stats import gradient_statistics
    from hnclip.errors import UnknownNameError
    with pytest.raises(UnknownNameError, match="fig4_gradient_dynamics"):
        gradient_statistics(probed_project, "fig6_sample_efficiency")


def test_report_caption_renders_as_the_literal_caption(tmp_path, monkeypatch):
    from docutils.core import publish_parts
    monkeypatch.chdir(tmp_path)
    assert gs.report_caption("fig4_gradient_dynamics") == ""           # before the statistics exist
    caption = "‖∇L_HN‖/‖∇L_CLIP‖ |x| *y* `z` a_ b\\c: 50%"
    write_json(gs.stats_path("fig4_gradient_dynamics"), {"caption": caption})
    html = publish_parts(gs.report_caption("fig4_gradient_dynamics"), writer="html",
                         settings_overrides={"halt_level": 2, "report_level": 5})["body"]
    assert html == f"<p>{caption}</p>\n"


def test_cli_verb_writes_the_statistics(probed_project, project_root, capsys):
    from hnclip.cli import main
    params = str(project_root / "params.yaml")
    assert main(["--params", params, "gradient-stats", "fig4_gradient_dynamics"]) == 0
    assert capsys.readouterr().out == f"wrote {gs.stats_path('fig4_gradient_dynamics')}\n"
    assert main(["--params", params, "gradient-stats", "table1"]) == 2
    assert "is not a gradient-dynamics figure" in capsys.readouterr().err
