"""Caption-geometry report (hnclip.report.geometry): Table A1 and Figs. 1, A5, A6 from stats records."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from hnclip.evaluation.caption_geometry import caption_geometry
from hnclip.report import geometry
from hnclip.report.paper_reference import paper_table

LABELS = {"docci": "DOCCI", "dci": "DCI", "long_dci": "Long-DCI", "urban1k": "Urban-1K"}
TRAIN_COUNTS = {"docci": 512, "dci": 480, "long_dci": 480, "urban1k": 600}
TRAIN_SETS = {"long_dci": "dci", "urban1k": "vg"}
MEAN_WORDS = {"docci": 120.25, "dci": 131.5, "long_dci": 190.75, "urban1k": 101.0}


def _record(benchmark: str, seed: int, shared: float) -> dict:
    """A stats record as `hnclip stats` writes it, from random features with a shared component
    (larger `shared` = more similar captions)."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(40, 16, generator=generator) + shared * torch.randn(1, 16, generator=generator)
    return {"benchmark": benchmark, "backbone": "tiny_pretrained", **caption_geometry(features),
            "lengths": {"mean_words": MEAN_WORDS[benchmark]}}


@pytest.fixture(scope="module")
def stats() -> dict:
    # Deliberately not in label order: outputs must follow `labels`.
    return {bench: _record(bench, seed, shared)
            for seed, (bench, shared) in enumerate([("urban1k", 3.0), ("dci", 1.0), ("docci", 0.5),
                                                    ("long_dci", 2.0)])}


@pytest.fixture(scope="module")
def frame(stats) -> pd.DataFrame:
    return geometry.table_a1(stats, TRAIN_COUNTS, LABELS, "tiny", train_sets=TRAIN_SETS)


def _cell(frame: pd.DataFrame, bench: str, metric: str) -> pd.Series:
    return frame[(frame["benchmark"] == bench) & (frame["metric"] == metric)].iloc[0]


# ---------------------------------------------------------------------------------------------
# Table A1
# ---------------------------------------------------------------------------------------------

def test_table_a1_is_tidy_in_label_order(frame):
    metrics = [metric for metric, _ in geometry.A1_METRICS]
    assert len(frame) == len(LABELS) * len(metrics)
    assert list(frame.columns) == geometry.A1_COLUMNS + ["profile"]
    assert list(dict.fromkeys(frame["benchmark"])) == list(LABELS)
    assert frame.groupby("benchmark", sort=False)["metric"].apply(list).tolist() == [metrics] * len(LABELS)
    assert set(frame["table"]) == {"tableA1"} and set(frame["profile"]) == {"tiny"}
    assert set(frame["encoder"]) == {"tiny_pretrained"}


def test_table_a1_values_paper_and_delta(frame, stats):
    paper = paper_table("tableA1")
    for bench in LABELS:
        record = stats[bench]
        expected = {"n_train": TRAIN_COUNTS[bench], "n_test": 40, "words": MEAN_WORDS[bench],
                    "pairwise_sim": record["mean_pairwise_cosine"],
                    "hardest_sim": record["mean_hardest_negative_cosine"]}
        for metric, ours in expected.items():
            cell = _cell(frame, bench, metric)
            printed = paper[(paper["benchmark"] == bench) & (paper["metric"] == metric)]["value"].iloc[0]
            assert cell["ours"] == pytest.approx(ours)
            assert cell["paper"] == pytest.approx(printed)
            assert cell["delta"] == pytest.approx(ours - printed)
    assert _cell(frame, "urban1k", "n_train")["paper"] == 14579
    assert _cell(frame, "dci", "hardest_sim")["paper"] == pytest.approx(0.92)
    assert _cell(frame, "urban1k", "n_train")["train_set"] == "vg"


def test_missing_train_count_and_unknown_benchmark_give_nan(stats):
    extra = {**stats, "toy": {**stats["dci"], "benchmark": "toy"}}
    frame = geometry.table_a1(extra, {"docci": 10}, LABELS, "tiny")
    assert math.isnan(_cell(frame, "dci", "n_train")["ours"])
    assert math.isnan(_cell(frame, "toy", "pairwise_sim")["paper"])
    assert math.isnan(_cell(frame, "toy", "pairwise_sim")["delta"])
    assert list(dict.fromkeys(frame["benchmark"]))[-1] == "toy"


def test_markdown_has_the_numbers_and_the_encoder_caveat(frame, stats):
    text = geometry.table_a1_markdown(frame, "tiny")
    docci = stats["docci"]
    assert f"| DOCCI | 512 | 40 | 120.2 | {docci['mean_pairwise_cosine']:.3f} | " \
           f"{docci['mean_hardest_negative_cosine']:.3f} |" in text
    assert "| Urban-1K | 600 (vg) |" in text
    assert "| DCI | 5445 | 1999 | 133 | 0.85 | 0.92 |" in text
    assert "| Urban-1K | 14579 (vg) | 1000 | 107 | 0.88 | 0.94 |" in text
    delta = docci["mean_pairwise_cosine"] - 0.84
    assert f"| DOCCI | -8938 | -5060 | -2.8 | {delta:+.3f} |" in text
    assert "NOT the pre-trained Long-CLIP-L" in text and "tiny_pretrained" in text


def test_markdown_of_the_paper_profile_has_no_caveat(stats):
    frame = geometry.table_a1(stats, TRAIN_COUNTS, LABELS, "paper")
    assert "NOT the pre-trained" not in geometry.table_a1_markdown(frame, "paper")


def test_latex_has_the_numbers_escaped(frame, stats):
    text = geometry.table_a1_latex(frame, "tiny")
    assert r"\begin{tabular}{lrrrrr}" in text and r"\end{tabular}" in text
    assert r"Benchmark & \#train & \#test & words & pairwise sim & hardest sim \\" in text
    assert r"Long-DCI & 5445 (dci) & 7444 & 134 & 0.85 & 0.93 \\" in text
    hardest = stats["long_dci"]["mean_hardest_negative_cosine"]
    assert f"& {hardest:.3f} \\\\" in text
    assert "tiny\\_pretrained" in text and "% The reproduced similarities" in text
    body = [line for line in text.splitlines() if not line.startswith("%")]
    assert all("_" not in line.replace(r"\_", "") for line in body)


def test_write_table_a1_writes_csv_md_tex(frame, tmp_path):
    outputs = geometry.write_table_a1(frame, "tiny", tmp_path / "tables" / "tableA1")
    assert [p.name for p in outputs] == ["tableA1.csv", "tableA1.md", "tableA1.tex"]
    back = pd.read_csv(outputs[0])
    assert len(back) == len(frame)
    assert np.allclose(back["delta"], frame["delta"], equal_nan=True)
    assert not list((tmp_path / "tables").glob("*.part"))


def test_stats_without_a_field_are_rejected(stats):
    broken = {"docci": {k: v for k, v in stats["docci"].items() if k != "in_batch_buckets"}}
    with pytest.raises(ValueError, match="docci.*in_batch_buckets"):
        geometry.table_a1(broken, {}, LABELS, "tiny")


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(geometry.FIGURES))
def test_figures_are_written_as_png_and_pdf(name, stats, tmp_path):
    outputs = geometry.FIGURES[name](stats, LABELS, tmp_path / "figures" / name)
    assert [p.suffix for p in outputs] == [".png", ".pdf"]
    assert outputs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert outputs[1].read_bytes()[:5] == b"%PDF-"
    assert all(p.stat().st_size > 1000 for p in outputs)
    assert not [p for p in (tmp_path / "figures").iterdir() if p not in outputs]  # no temporary left


def test_figure_a5_annotates_the_max_off_diagonal_entry(stats):
    fig = geometry.draw_figure_a5(stats, LABELS)
    try:
        panels = [ax for ax in fig.axes if ax.images]
        assert [ax.get_title().split("\n")[0] for ax in panels] == list(LABELS.values())
        for ax, bench in zip(panels, LABELS):
            g = np.array(stats[bench]["example_batch"]["G"])
            expected = g[~np.eye(len(g), dtype=bool)].max()
            annotations = [t.get_text() for t in ax.texts if t.get_gid() == "max_off_diagonal"]
            assert annotations == [f"{expected:.2f}"]
        # one colour scale shared by all panels
        assert len({ax.images[0].get_clim() for ax in panels}) == 1
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)


def test_max_off_diagonal_ignores_the_diagonal():
    g = np.full((4, 4), 0.2)
    np.fill_diagonal(g, 1.0)  # the positives, never annotated even when they are the largest
    g[2, 1] = g[1, 2] = 0.9
    assert geometry.max_off_diagonal({"example_batch": {"G": g.tolist()}}) == (1, 2, pytest.approx(0.9))


def test_histogram_density_integrates_to_one(stats):
    density, edges = geometry.histogram_density(stats["dci"]["pairwise_histogram"])
    assert (density * np.diff(edges)).sum() == pytest.approx(1.0)
    low, high = geometry.occupied_range([stats["dci"]["hardest_histogram"]])
    assert -1.0 <= low < stats["dci"]["mean_hardest_negative_cosine"] < high <= 1.0


def test_bucket_labels():
    assert geometry.bucket_labels([-1.0, 0.5, 0.7, 0.8, 0.9, 1.0]) == ["< 0.5", "0.5–0.7", "0.7–0.8", "0.8–0.9",
                                                                      "≥ 0.9"]
