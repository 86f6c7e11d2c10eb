"""R@1 by edit kind (`hnclip.report.edit_kinds`): each test row's kind from the generator's record of which
edit made each sibling, checked against the scenes themselves; Recall@1 per kind from hand-written ranks;
the refusal of a manifest the generator did not write; and the regime report's diagnostic section."""
from __future__ import annotations

import dataclasses
import shutil
from types import SimpleNamespace

import pytest

from hnclip.config import paths
from hnclip.config.registry import Registry
from hnclip.data.manifest import read_manifest, write_manifest
from hnclip.data.synthetic import generate_split, split_edits, write_dataset
from hnclip.data.synthetic_scenes import scene_differences
from hnclip.errors import StaleArtifactError
from hnclip.io import read_json, write_json
from hnclip.report.edit_kinds import SEVERAL, benchmark_row_kinds, markdown_rows, r1_by_kind, row_kinds

SMALL_DOCCI = {"train": 32, "test": 24}


def test_row_kinds_of_hand_built_families():
    ids = ["docci-test-f00000-m0", "docci-test-f00001-m1", "docci-test-f00000-m1",  # a colour pair
           "docci-test-f00001-m0",                                                 # a swap pair
           "docci-test-f00002-m0", "docci-test-f00002-m1", "docci-test-f00002-m2",  # base with two kinds
           "docci-test-f00003-m0"]                                                 # no sibling in the split
    edits = {"docci-test-f00000-m0": None, "docci-test-f00000-m1": "color", "docci-test-f00001-m0": None,
             "docci-test-f00001-m1": "position", "docci-test-f00002-m0": None, "docci-test-f00002-m1": "shape",
             "docci-test-f00002-m2": "size", "docci-test-f00003-m0": None}
    assert row_kinds(ids, edits) == ["color", "position", "color", "position", SEVERAL, "shape", "size", None]
    with pytest.raises(ValueError, match="1 test row"):
        row_kinds(ids + ["docci-test-f00009-m0"], edits)
    with pytest.raises(ValueError, match="carries no family id"):
        row_kinds(["img_17"], {"img_17": None})


def test_recall_at_1_per_kind_counts_the_queries_ranked_first():
    kinds = ["color", "color", "shape", "shape", "shape", None, "position", "position"]
    ranks = {"t2i": [0, 0, 0, 1, 2, 0, 1, 1], "i2t": [0, 1, 1, 1, 0, 5, 0, 1]}
    by_kind = r1_by_kind(ranks, kinds)
    assert list(by_kind) == ["color", "shape", "position", "all"]  # report order; the unpaired row in no kind
    assert by_kind["color"] == {"n": 2, "t2i": 100.0, "i2t": 50.0}
    assert by_kind["shape"]["n"] == 3 and by_kind["shape"]["t2i"] == pytest.approx(100 / 3)
    assert by_kind["shape"]["i2t"] == pytest.approx(100 / 3)
    assert by_kind["position"] == {"n": 2, "t2i": 0.0, "i2t": 50.0}
    assert by_kind["all"] == {"n": 7, "t2i": pytest.approx(300 / 7), "i2t": pytest.approx(300 / 7)}
    with pytest.raises(ValueError, match="7 t2i ranks for 8 test rows"):
        r1_by_kind({"t2i": ranks["t2i"][:7], "i2t": ranks["i2t"]}, kinds)
    header, rows = markdown_rows([{"label": "zero-shot", "epoch": 0, "r1": by_kind},
                                  {"label": "old record", "epoch": None, "r1": None}])
    assert header == ["model", "epoch", "colour", "shape", "position (swap)", "all"]
    assert rows == [["queries", "", "2", "3", "2", "7"], ["zero-shot", "0", "100 / 50", "33 / 33", "0 / 50", "43 / 43"],
                    ["old record", "", "n/a", "n/a", "n/a", "n/a"]]


ATTRIBUTE_KIND = {"color": "color", "shape": "shape", "texture": "texture", "size": "size", "cell": "position"}


@pytest.mark.parametrize("family_size", [2, 4])
def test_the_generator_record_names_the_edit_the_scenes_show(family_size):
    generator = {"style": "simple", "family_size": family_size}
    samples = generate_split("docci", "test", 40, seed=5, generator=generator)
    edits = split_edits("docci", "test", 40, seed=5, generator=generator)
    assert {s.id: (s.edit, s.caption) for s in samples} == edits  # the same rows, without rendering
    kinds = row_kinds([s.id for s in samples], {i: e for i, (e, _) in edits.items()})
    base = {s.family: s for s in samples if s.member == 0}
    for sample, kind in zip(samples, kinds):
        if sample.member == 0:
            assert kind == (SEVERAL if family_size > 2 else edits[sample.id.replace("-m0", "-m1")][0])
            continue
        shown = {ATTRIBUTE_KIND[attr] for _, attr in scene_differences(base[sample.family].scene, sample.scene)}
        assert shown == {kind}  # read off the two scenes, independently of the record
    assert {k for k in kinds} >= {"color", "shape", "texture", "size", "position"}


def small_params(params: dict, tmp_path) -> dict:
    params["profiles"]["tiny"]["data_root"] = str(tmp_path / "data")
    params["profiles"]["tiny"]["datasets"]["docci"]["sizes"] = dict(SMALL_DOCCI)
    return params


def write_docci_test(reg: Registry, tmp_path) -> list:
    """The profile's DOCCI-like test split, generated as `hnclip data` would, into the dataset directory."""
    spec = reg.profile["datasets"]["docci"]
    built = write_dataset(tmp_path / "built", "docci", {"test": spec["sizes"]["test"]}, spec["seed"],
                          generator=spec["generator"])
    target = reg.test_manifest("docci")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(built["test"], target)
    return read_manifest(target, check_images=False)


def test_benchmark_kinds_come_from_the_manifest_and_refuse_a_stale_one(params, tmp_path):
    reg = Registry(small_params(params, tmp_path))
    rows = write_docci_test(reg, tmp_path)
    kinds, note = benchmark_row_kinds(reg, "docci")
    assert len(kinds) == SMALL_DOCCI["test"] and None not in kinds and SEVERAL not in kinds  # pairs only
    assert note == "24 test rows of docci (test)"
    pair = {}
    for row, kind in zip(rows, kinds):
        pair.setdefault(row.id.rsplit("-m", 1)[0], set()).add(kind)
    assert all(len(k) == 1 for k in pair.values())  # both rows of a pair carry its edit
    write_manifest(reg.test_manifest("docci"), [dataclasses.replace(rows[0], caption=rows[0].caption + " Edited.")]
                   + rows[1:])
    with pytest.raises(StaleArtifactError, match="is not what the generator makes"):
        benchmark_row_kinds(reg, "docci")
    real = SimpleNamespace(params=reg.params, profile={"datasets": {"docci": {"kind": "real", "source": "docci"}}})
    assert benchmark_row_kinds(real, "docci") == (None, "docci is real data: its test pairs have no recorded edits")


def test_the_regime_report_carries_r1_by_edit_kind(params, tmp_path, monkeypatch):
    from test_regime import write_project  # every other file the regime report reads, written by hand

    from hnclip.commands.regime import build_regime, regime_inputs
    reg = Registry(small_params(params, tmp_path))
    monkeypatch.chdir(tmp_path)
    made = write_project(reg)
    rows = write_docci_test(reg, tmp_path)
    kinds, _ = benchmark_row_kinds(reg, "docci")
    # zero-shot: only the colour pairs ranked first; plain fine-tuning: every query; the L_HN run: not evaluated
    zeroshot = {d: [0 if k == "color" else 1 for k in kinds] for d in ("t2i", "i2t")}
    write_json(paths.evaluation(reg.zeroshot_id(), "docci"),
               {"best": {"epoch": 0, "metrics": {"t2i": {"R@1": 40.0}, "i2t": {"R@1": 40.0}, "ranks": zeroshot}}})
    write_json(paths.evaluation(made["plain"], "docci"),
               {"best": {"epoch": 2, "metrics": {"t2i": {"R@1": 100.0}, "i2t": {"R@1": 100.0},
                                                 "ranks": {d: [0] * len(rows) for d in ("t2i", "i2t")}}}})
    build_regime(reg)
    diagnostic = read_json(paths.regime_report("json"))["edit_kinds"]
    assert diagnostic["benchmark"] == "docci" and sum(diagnostic["kinds"].values()) == len(rows)
    zero, plain, hn = diagnostic["models"]
    assert (zero["label"], zero["epoch"]) == ("zero-shot", 0)
    assert (plain["label"], plain["epoch"]) == ("Long-CLIP FT (longclip_ft)", 2)
    assert zero["r1"]["color"] == {"n": diagnostic["kinds"]["color"], "t2i": 100.0, "i2t": 100.0}
    assert all(zero["r1"][k]["t2i"] == 0.0 for k in zero["r1"] if k not in ("color", "all"))
    assert {v["t2i"] for v in plain["r1"].values()} == {100.0}
    assert hn["r1"] is None and hn["note"].endswith("is missing")
    assert str(paths.dataset_dir(reg.profile["data_root"], "docci") / "dataset.json") in regime_inputs(reg)
    assert str(paths.evaluation(made["hn"], "docci")) in regime_inputs(reg)
    md = paths.regime_report("md").read_text()
    assert "## Diagnostic: R@1 by edit kind (DOCCI test pairs)" in md
    assert "| zero-shot | 0 | 100 / 100 |" in md and "| Long-CLIP FT (longclip_ft) | 2 | 100 / 100 |" in md
