"""Figures drawn on fake inputs: the gradient-dynamics figures (Fig. 4, A8) have every panel, band and
trace and quote their statistics file in the caption; Fig. 6 draws the strongest-baseline line from
Table 1's cells, or says in its legend that the baseline is not implemented yet."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from helpers.gradient_logs import RECORDS
from matplotlib.collections import PolyCollection

from hnclip.commands.gradient_stats import gradient_statistics
from hnclip.config import paths
from hnclip.config import registry as registry_module
from hnclip.config.constants import TRAINED_FRAMEWORKS
from hnclip.config.registry import Registry
from hnclip.io import write_json
from hnclip.report import figures


def _caption(fig) -> str:
    (text,) = [t for ax in fig.axes for t in ax.texts if t.get_gid() == "caption"]
    return " ".join(text.get_text().split("\n"))


def _data_lines(ax) -> list:
    return [line for line in ax.get_lines() if len(line.get_xdata())]


# ---- Fig. 4 ------------------------------------------------------------------------------------------
def test_fig4_has_every_panel_and_quotes_its_statistics(probed_project):
    stats = json.loads(gradient_statistics(probed_project, "fig4_gradient_dynamics").read_text())
    (run,) = stats["runs"]
    fig = figures.draw_gradient_dynamics(stats, {run["run_id"]: RECORDS}, "Fig. 4")
    try:
        loss_ax, share_ax, norm_ax, ratio_ax, error_ax, cos_ax, caption_ax = fig.axes
        assert not caption_ax.axison
        assert _caption(fig) == stats["caption"]
        clip_line, hn_line, threshold_line = _data_lines(loss_ax)     # L_CLIP, L_HN per measurement
        assert threshold_line.get_ydata()[0] == stats["saturation_threshold"]
        assert min(clip_line.get_ydata()) == figures.CLAMP          # exact zeros clamped
        # per epoch: L_CLIP saturated and L_HN active among measured batches, then among all micro-batches
        assert [list(line.get_ydata()) for line in _data_lines(share_ax)] == \
            [[0.75, 1.0], [0.75, 0.5], [0.25, 0.5, 1.0], [0.875, 0.75, 0.5]]
        # (b): per-epoch median norms, each with its interquartile band; the ratio with its band
        assert len(_data_lines(norm_ax)) == 2 and len([c for c in norm_ax.collections
                                                       if isinstance(c, PolyCollection)]) == 2
        assert list(_data_lines(ratio_ax)[0].get_ydata()) == pytest.approx([100.0, 10000.0])
        # (c): held-out retrieval error per epoch (0 = initial) in both directions
        assert [list(line.get_ydata()) for line in _data_lines(error_ax)] == [[40, 20, 18, 19], [45, 30, 25, 22]]
        cos_line, mean_line = _data_lines(cos_ax)[:2]
        assert list(cos_line.get_ydata()) == [0.5, 0.9, -0.1, 0.3]
        assert mean_line.get_ydata()[0] == pytest.approx(stats["runs"][0]["summary"]["cosine"]["mean"])
    finally:
        plt.close(fig)


def test_fig4_draws_one_trace_per_seed(probed_project):
    stats = json.loads(gradient_statistics(probed_project, "fig4_gradient_dynamics").read_text())
    second = {**stats["runs"][0], "run_id": "other-run", "seed": 43}
    stats["runs"].append(second)
    fig = figures.draw_gradient_dynamics(stats, {r["run_id"]: RECORDS for r in stats["runs"]}, "Fig. 4")
    try:
        labels = fig.axes[0].get_legend_handles_labels()[1]
        assert labels == ["L_CLIP s42", "L_HN s42", "L_CLIP s43", "L_HN s43"]
    finally:
        plt.close(fig)


def test_fig4_is_written_from_the_statistics_file(probed_project, tmp_path):
    spec = probed_project.params["figures"]["fig4_gradient_dynamics"]
    with pytest.raises(Exception, match="gradient-stats fig4_gradient_dynamics"):
        figures.gradient_dynamics(probed_project, spec, paths.figure("fig4_gradient_dynamics", "png").with_suffix(""))
    gradient_statistics(probed_project, "fig4_gradient_dynamics")
    written = figures.draw(probed_project, "fig4_gradient_dynamics")
    assert [p.suffix for p in written] == [".png", ".pdf"] and all(p.stat().st_size > 0 for p in written)


# ---- Fig. A8 -----------------------------------------------------------------------------------------
def test_figa8_grid_has_three_panels_per_run_and_the_pooled_caption(probed_project):
    stats = json.loads(gradient_statistics(probed_project, "figA8_gradient_dynamics_scales").read_text())
    runs = stats["runs"]
    fractions, columns = figures._grid_layout(runs)
    assert fractions == [0.05, 0.2, 0.5, 1.0] and ("docci", "hn_clip") in columns and ("dci", "hn_clip") in columns
    fig = figures.draw_gradient_dynamics_grid(stats, {r["run_id"]: RECORDS for r in runs}, "Fig. A8")
    try:
        assert len(fig.axes) == 3 * len(runs) + 1
        assert _caption(fig) == stats["caption"]
        loss_ax, norm_ax, cos_ax = fig.axes[:3]
        assert len(_data_lines(loss_ax)) == 4                     # raw + running median, both losses
        assert [line.get_linestyle() for line in _data_lines(norm_ax)] == ["-", "-", "--"]   # norms, ratio
        assert list(_data_lines(norm_ax)[2].get_ydata()) == pytest.approx([10, 500, 100, 10000])
        assert list(_data_lines(cos_ax)[0].get_ydata()) == [0.5, 0.9, -0.1, 0.3]
    finally:
        plt.close(fig)


# ---- Fig. 6 -----------------------------------------------------------------------------------------
def _fake_evaluations(reg: Registry, tables: list[str]) -> None:
    """An evaluation record (initial + two epochs) for every implemented cell of the tables."""
    for table in tables:
        for cell in reg.cells(table):
            if cell.run_id:
                epoch = {"t2i": {"R@1": 60.0}, "i2t": {"R@1": 62.0}}
                write_json(paths.evaluation(cell.run_id, cell.benchmark),
                           {"initial": {"t2i": {"R@1": 50.0}, "i2t": {"R@1": 50.0}},
                            "per_epoch": [{"epoch": 1, "metrics": epoch}, {"epoch": 2, "metrics": epoch}]})


def _table1_csv(values: dict[tuple[str, str], float]) -> None:
    """results/tables/table1.csv with R@1 cells {(row, benchmark): value} (same value both directions)."""
    rows = [{"table": "table1", "row": row, "benchmark": bench, "direction": d, "metric": "R@1", "ours_mean": v}
            for (row, bench), v in values.items() for d in ("t2i", "i2t")]
    paths.table("table1", "csv").parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(paths.table("table1", "csv"), index=False)


def _fig6(reg: Registry, monkeypatch) -> tuple:
    """Draw Fig. 6 (PNG and PDF) and return its two axes, kept open for inspection."""
    captured = {}
    save = figures.save_figure
    monkeypatch.setattr(figures, "save_figure", lambda fig, stem: captured.setdefault("fig", fig) and save(fig, stem))
    written = figures.sample_efficiency(reg, reg.params["figures"]["fig6_sample_efficiency"],
                                        paths.figure("fig6_sample_efficiency", "png").with_suffix(""))
    assert all(p.stat().st_size > 0 for p in written)
    return captured["fig"].axes


def _baseline_lines(ax) -> list:
    return [line for line in ax.get_lines() if line.get_gid() == "strongest_baseline"]


def test_fig6_says_the_baseline_is_not_implemented_and_draws_the_papers(params, tmp_path, monkeypatch):
    monkeypatch.setattr(registry_module, "RUNNABLE_FRAMEWORKS", TRAINED_FRAMEWORKS)  # no baseline trained
    reg = Registry(params)
    monkeypatch.chdir(tmp_path)
    _fake_evaluations(reg, ["tableA9"])
    ours, paper = _fig6(reg, monkeypatch)
    assert _baseline_lines(ours) == []
    labels = ours.get_legend_handles_labels()[1]
    assert "DOCCI: strongest baseline at 100% — not implemented yet (FineLIP, GOAL, StructXLIP)" in labels
    # The paper's line: StructXLIP on DOCCI, GOAL on DCI (Table 1, mean of both R@1 directions)
    lines = {line.get_label().split(":")[0]: (line.get_ydata()[0], line.get_label()) for line in _baseline_lines(paper)}
    assert lines["DOCCI"][0] == pytest.approx((84.73 + 82.61) / 2) and "StructXLIP" in lines["DOCCI"][1]
    assert lines["DCI"][0] == pytest.approx((77.29 + 74.84) / 2) and "GOAL" in lines["DCI"][1]
    plt.close("all")


def test_fig6_draws_the_strongest_baseline_from_table1(params, tmp_path, monkeypatch):
    reg = Registry(params)
    monkeypatch.chdir(tmp_path)
    _fake_evaluations(reg, ["tableA9"])
    _table1_csv({("finelip", "docci"): 60.0, ("goal", "docci"): 71.0, ("structxlip", "docci"): 75.0,
                 ("finelip", "dci"): 50.0, ("goal", "dci"): 64.0, ("structxlip", "dci"): 63.0,
                 ("hn_clip", "docci"): 99.0, ("longclip_zeroshot", "dci"): 98.0})
    ours, _ = _fig6(reg, monkeypatch)
    drawn = {line.get_label().split(":")[0]: line for line in _baseline_lines(ours)}
    assert drawn["DOCCI"].get_ydata()[0] == 75.0 and drawn["DCI"].get_ydata()[0] == 64.0   # never HN-CLIP's 99
    assert drawn["DOCCI"].get_linestyle() == ":"
    assert drawn["DOCCI"].get_label() == "DOCCI: strongest baseline at 100% (StructXLIP, table1)"
    assert drawn["DCI"].get_label() == "DCI: strongest baseline at 100% (GOAL, table1)"
    plt.close("all")


def test_fig6_names_the_baselines_still_missing(params, tmp_path, monkeypatch):
    monkeypatch.setattr(registry_module, "RUNNABLE_FRAMEWORKS", (*TRAINED_FRAMEWORKS, "goal"))
    reg = Registry(params)
    monkeypatch.chdir(tmp_path)
    _fake_evaluations(reg, ["tableA9"])
    _table1_csv({("goal", "docci"): 71.0, ("goal", "dci"): 64.0, ("structxlip", "docci"): 90.0})
    ours, _ = _fig6(reg, monkeypatch)
    drawn = {line.get_label().split(":")[0]: line for line in _baseline_lines(ours)}
    assert drawn["DOCCI"].get_ydata()[0] == 71.0    # StructXLIP's stray cell is not implemented: ignored
    assert drawn["DOCCI"].get_label() == ("DOCCI: strongest baseline at 100% (GOAL, table1; not implemented yet: "
                                          "FineLIP, StructXLIP)")
    plt.close("all")


def test_fig6_needs_table1_once_a_baseline_is_implemented(params, tmp_path, monkeypatch):
    reg = Registry(params)
    monkeypatch.chdir(tmp_path)
    _fake_evaluations(reg, ["tableA9"])
    with pytest.raises(Exception, match="table1.csv is missing"):
        _fig6(reg, monkeypatch)
    plt.close("all")


# ---- Fig. A5: one real training batch ------------------------------------------------------------------
def test_figa5_batch_is_the_first_micro_batch_the_training_loop_yields():
    from hnclip.commands.stats import first_training_batch
    from hnclip.data.loader import subset_indices
    from hnclip.training.batching import accumulation_groups, epoch_micro_batches
    loop_first = accumulation_groups(epoch_micro_batches(subset_indices(100, 1.0), 16, 42, 0), 8)[0][0]
    batch = first_training_batch(100, micro_batch=16, seed=42, captions=8)
    assert batch == loop_first[:8]
    assert batch == epoch_micro_batches(list(range(100)), 8, 42, 0)[0]      # = a B=8 loader's first batch
    assert batch != first_training_batch(100, micro_batch=16, seed=43, captions=8)
    with pytest.raises(ValueError, match="fewer than one micro-batch"):
        first_training_batch(10, micro_batch=16, seed=42, captions=8)


def test_figa5_record_holds_the_batch_matrix_and_is_drawn():
    import numpy as np
    import torch

    from hnclip.commands.stats import training_batch_geometry
    from hnclip.report import geometry

    class Row:
        def __init__(self, i):
            self.id = f"img{i}"
    features = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 2.0]])   # unit cosines 0.6, 0.0, 0.8
    record = training_batch_geometry(features, [Row(i) for i in range(5)], [4, 0, 2], "dci", 42, 16)
    assert record["ids"] == ["img4", "img0", "img2"] and record["source"] == "train"
    assert np.allclose(record["G"], [[0, 0.6, 0], [0.6, 0, 0.8], [0, 0.8, 0]])
    assert record["offdiag_mean"] == pytest.approx((0.6 + 0.0 + 0.8) * 2 / 6)
    fig = geometry.draw_figure_a5({"docci": {**_geometry_record(), "example_batch": record}}, {"docci": "DOCCI"})
    try:
        (image,) = fig.axes[0].get_images()
        assert np.allclose(image.get_array().filled(0), record["G"])
        assert "off-diagonal mean 0.47" in fig.axes[0].get_title()
    finally:
        plt.close(fig)


def _geometry_record() -> dict:
    """The other fields `hnclip stats` writes (Fig. A5 reads only example_batch)."""
    return {key: {} for key in ("n_captions", "mean_pairwise_cosine", "mean_hardest_negative_cosine", "lengths",
                                "pairwise_histogram", "hardest_histogram", "in_batch_buckets")}
