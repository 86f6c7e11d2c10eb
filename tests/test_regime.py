"""The regime report (params.yaml `regime_targets`, results/stats/regime.*): the sibling share on
hand-built manifests and batches, the loss shares of hand-written step logs, the met / not-met
logic on each side of a target, the step log's new fields, and `hnclip regime` in a project whose
every input is written by hand."""
from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from hnclip.cli import main
from hnclip.commands.regime import planned_run, regime_inputs
from hnclip.config import paths
from hnclip.config.params import ParamsError, validate_params
from hnclip.config.registry import Registry
from hnclip.data.loader import subset_indices
from hnclip.data.manifest import ManifestRow, read_manifest, write_manifest
from hnclip.data.synthetic import family_of
from hnclip.io import read_json, read_jsonl, write_json, write_jsonl
from hnclip.report import regime
from hnclip.training.batching import epoch_micro_batches
from hnclip.training.methods import Method
from hnclip.training.step import step_record

LOSS_NAMES = Method.loss_names  # HN-CLIP's terms


def row(row_id: str) -> ManifestRow:
    return ManifestRow(id=row_id, image=f"images/{row_id}.png", caption=f"caption of {row_id}", short_caption=None,
                       split="train", source_sha256="0" * 64)


def synthetic_ids(families: list[int], variant: str = "docci") -> list[str]:
    """Generator-style ids, one per entry: the family given, members numbered within it."""
    seen: dict[int, int] = {}
    ids = []
    for family in families:
        seen[family] = seen.get(family, -1) + 1
        ids.append(f"{variant}-train-f{family:05d}-m{seen[family]}")
    return ids


# ---- sibling share ---------------------------------------------------------------------------------
def test_sibling_share_of_hand_built_batches(tmp_path):
    # families A A B C D D E F, written and read back as a manifest (the ids carry the families)
    write_manifest(tmp_path / "train.jsonl", [row(i) for i in synthetic_ids([0, 0, 1, 2, 3, 3, 4, 5])])
    families = [family_of(r.id) for r in read_manifest(tmp_path / "train.jsonl", check_images=False)]
    assert families[0] == families[1] == "docci-train-f00000" and len(set(families)) == 6
    batches = [[0, 1, 2, 3],   # A A B C: siblings
               [4, 5, 6, 7],   # D D E F: siblings
               [0, 2, 4, 6],   # A B D E: none
               [1, 3, 5, 7]]   # A C D F: none
    assert regime.sibling_batch_share(batches, families) == 0.5
    assert regime.sibling_batch_share(batches[:3], families) == pytest.approx(2 / 3)
    assert regime.sibling_batch_share([[2, 3, 6, 7]], families) == 0.0


def test_sibling_share_does_not_apply_to_rows_without_families():
    real_ids = ["aar_test_04600", "aar_test_04601", "docci-train-f00001-m0", "x-f00001-m0"]
    assert [family_of(i) for i in real_ids] == [None, None, "docci-train-f00001", None]
    assert regime.sibling_batch_share([[0, 1], [2, 3]], [family_of(i) for i in real_ids]) is None
    with pytest.raises(ValueError, match="smaller than one micro-batch"):
        regime.sibling_batch_share([], ["a", "b"])


def test_generated_manifests_carry_their_families(tiny_data):
    rows = read_manifest(tiny_data["train"], check_images=False)
    families = [family_of(r.id) for r in rows]
    assert None not in families
    counts = {f: families.count(f) for f in families}
    assert set(counts.values()) == {4} and len(counts) == len(rows) // 4  # DOCCI-like families of four


# ---- loss shares from the steps log ------------------------------------------------------------------
STEPS = [
    {"step": 1, "epoch": 1, "saturated_frac": 1.0, "hn_unsaturated_frac": 1.0, "micro_batches": 8},
    {"step": 2, "epoch": 1, "saturated_frac": 0.5, "hn_unsaturated_frac": 0.75, "micro_batches": 8},
    {"step": 3, "epoch": 1, "saturated_frac": 0.0, "hn_unsaturated_frac": 0.5, "micro_batches": 4},  # short group
    {"step": 4, "epoch": 2, "saturated_frac": 0.25, "hn_unsaturated_frac": 0.0, "micro_batches": 8},
]


def test_epoch_shares_weight_steps_by_their_micro_batches(tmp_path):
    write_jsonl(tmp_path / "steps.jsonl", STEPS)
    steps = read_jsonl(tmp_path / "steps.jsonl")
    assert regime.epoch_share(steps, 1, "saturated_frac") == pytest.approx((8 + 4 + 0) / 20)
    assert regime.epoch_share(steps, 1, "hn_unsaturated_frac") == pytest.approx((8 + 6 + 2) / 20)
    assert regime.epoch_share(steps, 2, "saturated_frac") == 0.25
    assert regime.epoch_share(steps, 3, "saturated_frac") is None                 # no such epoch
    old_log = [{k: v for k, v in s.items() if k not in ("micro_batches", "hn_unsaturated_frac")} for s in steps]
    assert regime.epoch_share(old_log, 1, "saturated_frac") == pytest.approx(0.5)  # equal weights
    assert regime.epoch_share(old_log, 1, "hn_unsaturated_frac") is None


def test_epoch_summary_share_reads_the_training_record():
    history = [{"epoch": 1, "train": {"hn_saturated_frac": 0.125}}, {"epoch": 2, "train": {}}]
    assert regime.epoch_summary_share(history, 1, "hn_saturated_frac") == 0.125
    assert regime.epoch_summary_share(history, 2, "hn_saturated_frac") is None
    assert regime.epoch_summary_share(history, 3, "hn_saturated_frac") is None


def test_step_log_records_the_hn_share_and_micro_batches():
    model = SimpleNamespace(logit_scale=torch.tensor(0.0))
    records = [{"infonce": 1e-4, "hn": 2e-3, "total": 1.0}, {"infonce": 2e-4, "hn": 1e-4, "total": 1.0},
               {"infonce": 0.5, "hn": 1e-3, "total": 1.0}, {"infonce": 0.5, "hn": 3.0, "total": 1.0}]
    step = step_record(1, 0, 1e-4, 1.0, model, records, "micro", 16, LOSS_NAMES)
    assert step["saturated_frac"] == 0.5 and step["hn_unsaturated_frac"] == 0.75  # 1e-3 itself is not saturated
    assert step["micro_batches"] == 4 and step["epoch"] == 1
    plain = step_record(1, 0, 1e-4, 1.0, model, [{"infonce": 1e-4, "total": 1e-4}], "micro", 16, LOSS_NAMES)
    assert "hn_unsaturated_frac" not in plain and plain["saturated_frac"] == 1.0
    exact = step_record(1, 0, 1e-4, 1.0, model, [{"infonce": 0.1, "hn": 0.2, "total": 0.2, "micro_batches": 8}],
                        "exact", 128, LOSS_NAMES)
    assert exact["micro_batches"] == 8  # one exact-batch record stands for the whole group


# ---- met / not met -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "op", "threshold", "met"), [
    (40.0, ">=", 40.0, True), (39.99, ">=", 40.0, False), (55.0, ">=", 40.0, True),
    (0.15, "<=", 0.15, True), (0.1501, "<=", 0.15, False), (0.0, "<=", 0.15, True),
    (None, ">=", 0.5, None),
])
def test_check_on_each_side_of_its_target(value, op, threshold, met):
    result = regime.check("item", value, op, threshold, "results/x.json")
    assert result["met"] is met and result["target"] == f"{op} {threshold:g}"


def test_preconditions_hold_only_when_every_measured_check_does():
    def checks(*verdicts):
        return [{"met": v} for v in verdicts]
    assert regime.precondition("k", "t", checks(True, True))["met"] is True
    assert regime.precondition("k", "t", checks(True, False))["met"] is False
    assert regime.precondition("k", "t", checks(True, None))["met"] is True      # n/a checks are not counted
    assert regime.precondition("k", "t", checks(None, None))["met"] is None
    assert regime.all_met([False, None]) is False
    with pytest.raises(ValueError, match="unknown comparison"):
        regime.check("item", 1.0, ">", 0.5, None)


# ---- params ----------------------------------------------------------------------------------------
def test_targets_are_validated_by_the_schema(params):
    validate_params(params)
    assert params["regime_targets"]["zeroshot_r1"]["min"] == 40.0
    bad = copy.deepcopy(params)
    bad["regime_targets"]["sibling_share"]["max"] = 15
    with pytest.raises(ParamsError, match=r"regime_targets\.sibling_share\.max: 15 is greater than the maximum"):
        validate_params(bad)


# ---- `hnclip regime` end to end on hand-written inputs --------------------------------------------------
R1 = {"t2i": 42.5, "i2t": 38.0}
GEOMETRY = {"docci": (0.62, 0.93), "dci": (0.55, 0.91), "long_dci": (0.48, 0.95), "urban1k": (0.71, 0.92)}
FT_GAIN = {"t2i": 7.5, "i2t": 3.0}
HN_HISTORY = [{"epoch": 1, "train": {"hn_saturated_frac": 0.05}}]


def write_project(reg: Registry) -> dict:
    """Every file the regime step reads, by hand, in the current directory; returns the run ids."""
    root, micro, seed = reg.profile["data_root"], reg.profile["recipe"]["micro_batch"], reg.profile["seeds"][0]
    write_json(paths.evaluation(reg.zeroshot_id(), "docci"),
               {"best": {"epoch": 0, "metrics": {d: {"R@1": v} for d, v in R1.items()}}})
    runs = {"plain": planned_run(reg, "longclip_ft", "docci"), "hn": planned_run(reg, "hn_only", "docci")}
    write_json(paths.evaluation(runs["plain"], "docci"),  # its best epoch: +7.5 / +3.0 over zero-shot
               {"best": {"epoch": 3, "metrics": {d: {"R@1": v + FT_GAIN[d]} for d, v in R1.items()}}})
    write_jsonl(paths.run_steps(runs["plain"]), [{**s, "micro_batches": micro} for s in (
        {"step": 1, "epoch": 1, "saturated_frac": 0.75}, {"step": 2, "epoch": 1, "saturated_frac": 0.25},
        {"step": 3, "epoch": 1, "saturated_frac": 0.5}, {"step": 4, "epoch": 2, "saturated_frac": 1.0})])
    write_json(paths.run_record(runs["plain"]), {"history": []})
    # the L_HN run's log predates hn_unsaturated_frac: its training record's epoch summary answers
    write_jsonl(paths.run_steps(runs["hn"]), [{"step": 1, "epoch": 1, "saturated_frac": 1.0}])
    write_json(paths.run_record(runs["hn"]), {"history": HN_HISTORY})
    # DOCCI: ten sibling pairs among 44 single rows, so the share depends on the loader's exact order
    families = {"docci": [i // 2 if i < 20 else 100 + i for i in range(4 * micro)], "dci": list(range(2 * micro))}
    for role, fams in families.items():
        write_manifest(paths.manifest(root, role, "train"), [row(i) for i in synthetic_ids(fams, role)])
    write_manifest(paths.manifest(root, "vg", "train"), [row(f"vg_{i}") for i in range(2 * micro)])  # real ids
    for role in ("docci", "dci", "vg"):
        write_json(paths.dataset_dir(root, role) / "dataset.json", {})
    for bench, (pairwise, hardest) in GEOMETRY.items():
        write_json(paths.stats(bench), {"mean_pairwise_cosine": pairwise, "mean_hardest_negative_cosine": hardest})
    return {**runs, "seed": seed, "micro": micro, "docci_families": [family_of(i) for i in synthetic_ids(
        families["docci"], "docci")]}


def test_cli_writes_the_report_and_its_markdown(params, tmp_path, monkeypatch, capsys):
    reg = Registry(params)
    (tmp_path / "workflow").symlink_to(Path(__file__).resolve().parents[1] / "workflow")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    made = write_project(reg)
    assert main(["regime"]) == 0
    assert capsys.readouterr().out.split() == ["wrote", "results/stats/regime.json", "wrote", "results/stats/regime.md"]
    report = read_json(paths.regime_report("json"))
    by_key = {p["key"]: p for p in report["preconditions"]}
    zeroshot = by_key["zeroshot_r1"]["checks"]
    assert [(c["value"], c["met"]) for c in zeroshot] == [(42.5, True), (38.0, False)]
    assert by_key["zeroshot_r1"]["met"] is False
    (plain,) = by_key["infonce_saturation"]["checks"]
    assert plain["value"] == pytest.approx(0.5) and plain["met"] is True
    assert plain["source"] == str(paths.run_steps(made["plain"]))
    (hn,) = by_key["hn_unsaturated"]["checks"]
    assert hn["value"] == pytest.approx(0.95) and hn["met"] is True
    assert hn["source"] == str(paths.run_record(made["hn"])) and "predates" in hn["note"]
    docci, dci, vg = by_key["sibling_share"]["checks"]
    def share(seed, epoch):  # the seed's training loader in that epoch (0-based), over the 64 DOCCI rows
        batches = epoch_micro_batches(subset_indices(4 * made["micro"], 1.0), made["micro"], seed, epoch)
        return regime.sibling_batch_share(batches, made["docci_families"])
    assert docci["value"] == share(made["seed"], 0) == 0.5  # 2 of its 4 micro-batches
    assert share(made["seed"], 1) != 0.5 and share(made["seed"] + 1, 0) != 0.5  # another epoch or seed differs
    assert (docci["met"], dci["value"], dci["met"]) == (False, 0.0, True)
    assert (vg["value"], vg["met"]) == (None, None) and "no family ids" in vg["note"]
    assert by_key["sibling_share"]["met"] is False
    geometry = by_key["caption_geometry"]["checks"]
    assert [c["met"] for c in geometry] == [True, True, False, True]  # Long-DCI 0.48 < 0.5
    assert geometry[0]["hardest_negative"] == 0.93 and report["all_met"] is False
    headroom = by_key["headroom"]["checks"]  # plain fine-tuning's best epoch − zero-shot, per direction
    assert [(c["value"], c["met"]) for c in headroom] == [(pytest.approx(7.5), True), (pytest.approx(3.0), False)]
    assert headroom[0]["source"] == str(paths.evaluation(made["plain"], "docci")) and "epoch 3" in headroom[0]["note"]
    assert by_key["headroom"]["met"] is False
    assert report["runs"] == {"plain": made["plain"], "hn": made["hn"]}
    inputs = report["provenance"]["inputs"]
    assert inputs[f"steps:{made['plain']}"]["sha256"] and inputs["train_manifest:vg"]["path"].endswith("vg/train.jsonl")
    assert set(regime_inputs(reg)) >= {e["path"] for k, e in inputs.items() if not k.startswith("train_manifest:")}
    md = paths.regime_report("md").read_text()
    assert "**All preconditions met: no**" in md
    assert "| Zero-shot R@1 (%) before fine-tuning | DOCCI T→I R@1 | 42.50 | ≥ 40 | yes |" in md
    assert "| Mean pairwise caption cosine (initial backbone) | Long-DCI test captions | 0.480 | ≥ 0.5 | no |" in md
    assert "| Fine-tuning headroom: plain fine-tuning − zero-shot R@1 (points) | DOCCI I→T R@1 | 3.00 | ≥ 5 | no |" \
        in md
    # saturation by epoch, a diagnostic: plain fine-tuning saturates fully in epoch 2; the L_HN run's old log
    # records no L_HN share per step
    by_epoch = {row["method"]: row["by_epoch"] for row in report["saturation_by_epoch"]}
    assert by_epoch == {"longclip_ft": {"1": pytest.approx(0.5), "2": 1.0}, "hn_only": {"1": None}}
    assert "| InfoNCE saturated (longclip_ft) | 0.500 | 1.00 |" in md and "## Saturation by epoch" in md


def test_a_run_no_table_trains_is_reported_not_measured(params, tmp_path, monkeypatch):
    params["regime_targets"]["infonce_saturation"]["method"] = "goal_corrected"  # its table is optional
    reg = Registry(params)
    monkeypatch.chdir(tmp_path)
    write_project(reg)
    from hnclip.commands.regime import build_regime
    build_regime(reg)
    report = read_json(paths.regime_report("json"))
    (check,) = next(p for p in report["preconditions"] if p["key"] == "infonce_saturation")["checks"]
    assert (check["value"], check["met"], check["source"]) == (None, None, None)
    assert "no table of profile 'tiny' trains goal_corrected on docci" in check["note"]


def test_unknown_names_in_the_targets_fail_naming_the_key(params, tmp_path, monkeypatch, capsys):
    params["regime_targets"]["hn_unsaturated"]["methods"] = ["longclip_ft"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (tmp_path / "workflow").symlink_to(Path(__file__).resolve().parents[1] / "workflow")
    monkeypatch.chdir(tmp_path)
    assert main(["regime"]) == 2
    assert "regime_targets.hn_unsaturated.methods: 'longclip_ft' does not train L_HN" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("snakemake", path=str(Path(sys.executable).parent)) is None,
                    reason="snakemake is not installed in the venv")
def test_rule_all_builds_the_report_from_the_runs_step_logs(empty_project, params):
    root = Path(__file__).resolve().parents[1]
    (empty_project / "Snakefile").symlink_to(root / "Snakefile")
    out = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "-n", "--cores", "1"],
                         cwd=empty_project, capture_output=True, text=True, check=True).stdout
    block = out.split("rule regime:")[1].split("\n\n")[0]
    reg = Registry(params)
    for run in (planned_run(reg, "longclip_ft", "docci"), planned_run(reg, "hn_only", "docci")):
        assert str(paths.run_steps(run)) in block
    assert "output: results/stats/regime.json, results/stats/regime.md" in block
