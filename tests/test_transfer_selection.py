"""Transfer cells (Tables A7, A10's cross rows) use the checkpoint selected on the run's own training
benchmark: the training job keeps that epoch's weights (model_selected.pt, surviving a resume), the
evaluation of a transfer benchmark encodes them and says so, lineage and audit follow them, and the
tables' notes name the epoch.

The per-epoch scores are scripted (the real evaluation, with its Recall@1/5 replaced) so that the
selected epoch is known and is not the last one."""
from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from helpers.training import EVALUATION, EXECUTION, SPEC

from hnclip.commands.evaluate import evaluate_run
from hnclip.config import paths
from hnclip.config.registry import Registry
from hnclip.errors import StaleArtifactError
from hnclip.evaluation.retrieval import evaluate_model
from hnclip.evaluation.selection import own_benchmark
from hnclip.hashing import sha256_file, state_dict_digest
from hnclip.io import read_json
from hnclip.models import factory
from hnclip.provenance.audit_claims import Auditor
from hnclip.provenance.audit_runs import check_evaluation
from hnclip.provenance.lineage import iter_nodes, lineage
from hnclip.report import build, tables
from hnclip.training import loop
from hnclip.training.jobs import finetune_job

# Per evaluation call (the initial weights, then epochs 1..3): (Recall@1, Recall@5) in both directions.
# mean R@1 selects epoch 2, rsum (the sum of every recall) epoch 1; the last epoch is 3 under both.
SCORES = [(1.0, 5.0), (20.0, 95.0), (50.0, 50.0), (30.0, 60.0)]
SELECTED = {"mean_r1": 2, "rsum": 1}
THREE_EPOCHS = {**SPEC, "recipe": {**SPEC["recipe"], "epochs": 3}}


class ScriptedEvaluation:
    """The loop's evaluation, with each call's Recall@1/@5 taken from SCORES in turn."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *args, **kwargs) -> dict:
        metrics = evaluate_model(*args, **kwargs)
        r1, r5 = SCORES[self.calls]
        self.calls += 1
        for direction in ("t2i", "i2t"):
            metrics[direction].update({"R@1": r1, "R@5": r5})
        return metrics


def _digest(path) -> str:
    return state_dict_digest(torch.load(path, map_location="cpu", weights_only=True)["state_dict"])


def _job(tiny_data, out, metric="mean_r1") -> loop.TrainJob:
    return loop.TrainJob(run_id="transfer-run", spec=THREE_EPOCHS, spec_hash="t" * 64, init_kind="scratch",
                         init_path=None, model_config="hnclip-tiny", train_manifest=tiny_data["train"],
                         eval_manifests={"docci": tiny_data["test"]}, out_dir=out / "run",
                         checkpoint_dir=out / "ckpt", execution=EXECUTION,
                         evaluation={**EVALUATION, "selection_metric": metric}, selection_benchmark="docci")


# ---- training: the selected epoch's weights ------------------------------------------------------
@pytest.mark.parametrize("metric", ["mean_r1", "rsum"])
def test_selected_checkpoint_holds_the_best_epoch_not_the_last(tiny_data, tmp_path, monkeypatch, metric):
    monkeypatch.setattr(loop, "evaluate_model", ScriptedEvaluation())
    job = _job(tiny_data, tmp_path, metric)
    record = train_and_read(job)
    epoch = SELECTED[metric]
    weights = {h["epoch"]: h["weights_sha256"] for h in record["history"]}
    assert record["selected_checkpoint"] == {"benchmark": "docci", "metric": metric, "epoch": epoch,
                                             "weights_sha256": weights[epoch]}
    selected = job.out_dir / "model_selected.pt"
    assert _digest(selected) == weights[epoch] != weights[3] == _digest(job.out_dir / "model.pt")
    assert record["outputs"]["model_selected"] == {"path": str(selected), "sha256": sha256_file(selected)}
    assert not job.checkpoint_dir.exists()  # a finished run's resume area is cleared (retention)


def test_keep_resume_checkpoints_keeps_the_resume_area(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "evaluate_model", ScriptedEvaluation())
    job = dataclasses.replace(_job(tiny_data, tmp_path),
                              execution={**EXECUTION, "keep_resume_checkpoints": True})
    record = train_and_read(job)
    epoch = record["selected_checkpoint"]["epoch"]
    # keep_epoch_weights is off: the resume area holds the selected epoch's weights, not every epoch's
    assert sorted(p.name for p in job.checkpoint_dir.glob("*.pt")) == ["last.pt", "previous.pt",
                                                                       f"selected_epoch_{epoch:02d}.pt"]


def test_retention_keeps_the_epoch_weights_asked_for(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "evaluate_model", ScriptedEvaluation())
    job = dataclasses.replace(_job(tiny_data, tmp_path), execution={**EXECUTION, "keep_epoch_weights": True})
    record = train_and_read(job)
    assert sorted(p.name for p in job.checkpoint_dir.iterdir()) == ["epoch_01.pt", "epoch_02.pt", "epoch_03.pt"]
    weights = {h["epoch"]: h["weights_sha256"] for h in record["history"]}
    assert {e: _digest(job.checkpoint_dir / f"epoch_{e:02d}.pt") for e in weights} == weights


def train_and_read(job: loop.TrainJob) -> dict:
    loop.train(job)
    return read_json(job.out_dir / "train.json")


def test_a_resume_keeps_the_epoch_selected_before_the_interruption(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "evaluate_model", ScriptedEvaluation())
    reference = train_and_read(_job(tiny_data, tmp_path / "uninterrupted"))

    monkeypatch.setattr(loop, "evaluate_model", ScriptedEvaluation())  # one script across both attempts
    real_backward, steps = loop.group_backward, {"n": 0}

    def interrupted(*args, **kwargs):
        steps["n"] += 1
        if steps["n"] == 8:  # inside epoch 3 (3 optimizer steps an epoch), after epoch 2's checkpoint
            raise KeyboardInterrupt
        return real_backward(*args, **kwargs)

    monkeypatch.setattr(loop, "group_backward", interrupted)
    job = _job(tiny_data, tmp_path / "interrupted")
    with pytest.raises(KeyboardInterrupt):
        loop.train(job)
    assert not job.out_dir.exists()
    assert (job.checkpoint_dir / "selected_epoch_02.pt").is_file()  # epoch 2, the best so far, in the resume area
    monkeypatch.setattr(loop, "group_backward", real_backward)

    bare = dataclasses.replace(job, checkpoint_dir=tmp_path / "bare")  # a resume area that lost them is refused
    shutil.copytree(job.checkpoint_dir, bare.checkpoint_dir)
    (bare.checkpoint_dir / "selected_epoch_02.pt").unlink()
    with pytest.raises(StaleArtifactError, match="weights of epoch 2, selected on docci, are not in"):
        loop.train(bare)

    resumed = train_and_read(job)
    assert resumed["resumed_from_step"] == 6 and resumed["selected_checkpoint"]["epoch"] == 2
    assert resumed["selected_checkpoint"] == reference["selected_checkpoint"]
    assert _digest(job.out_dir / "model_selected.pt") == reference["history"][1]["weights_sha256"]


def test_own_benchmark_is_the_first_in_domain_benchmark(params):
    reg = Registry(params, validate=False)
    assert reg.eval_benchmarks("dci") == ["dci", "long_dci"] and own_benchmark(reg.eval_benchmarks("dci")) == "dci"
    assert own_benchmark(reg.eval_benchmarks("docci")) == "docci" and own_benchmark([]) is None


# ---- evaluation, lineage, audit and the table of a transfer cell ---------------------------------
@pytest.fixture
def a7_project(params, tmp_path, monkeypatch) -> dict:
    """Table A7's HN-CLIP run (trained on DOCCI, tested on Long-DCI) trained for 3 scripted epochs in
    a project directory (from scratch: no backbone is pretrained), with hand-made records for A7's
    other cells."""
    from hnclip.data.synthetic import write_dataset
    tiny = params["profiles"]["tiny"]
    tiny["datasets"]["docci"]["sizes"] = {"train": 48, "test": 24}
    tiny["datasets"]["dci"]["sizes"] = {"train": 48, "test": 24}
    tiny["recipe"].update(epochs=3, micro_batch=8, grad_accum=2)
    tiny["execution"].update(eval_batch_size=64, checkpoint_every_steps=2, keep_epoch_weights=False)
    reg = Registry(params, validate=False)
    monkeypatch.chdir(tmp_path)
    write_dataset("data/embedded/docci", "docci", {"train": 48, "test": 24}, seed=0)
    write_dataset("data/embedded/dci", "dci", {"test": 24}, seed=0)  # test and test_long (Long-DCI)
    cell = next(c for c in reg.cells("tableA7") if c.row == "hn_clip")
    job = finetune_job(reg, cell.run_id)
    assert job.selection_benchmark == "docci"
    job = dataclasses.replace(job, init_kind="scratch", init_path=None, eval_cache_dir=None,
                              execution={**job.execution, "grad_probe_every": 0})
    monkeypatch.setattr(loop, "evaluate_model", ScriptedEvaluation())
    loop.train(job)
    for other in reg.cells("tableA7"):
        if other.run_id and other.run_id != cell.run_id:
            _write_record(other, reg, epoch=1)
    return {"reg": reg, "run_id": cell.run_id, "train": read_json(paths.run_record(cell.run_id))}


def _write_record(cell, reg: Registry, epoch: int) -> None:
    metrics = {d: {f"R@{k}": 10.0 for k in (1, 5, 10, 25, 50)} for d in ("t2i", "i2t")}
    best = {"epoch": epoch, "metrics": metrics}
    if cell.train_set and cell.benchmark not in reg.eval_benchmarks(cell.train_set):
        best.update(checkpoint="model_selected", selected_on={"benchmark": cell.train_set, "metric": "mean_r1"})
    path = paths.evaluation(cell.run_id, cell.benchmark)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run_id": cell.run_id, "benchmark": cell.benchmark, "best": best, "last": best}))


def test_transfer_evaluation_encodes_the_selected_checkpoint(a7_project, monkeypatch):
    reg, run_id, train = a7_project["reg"], a7_project["run_id"], a7_project["train"]
    loaded = []
    real_load = factory.load_weights
    monkeypatch.setattr(factory, "load_weights", lambda path: loaded.append(str(path)) or real_load(path))
    out = read_json(evaluate_run(reg, run_id, "long_dci"))
    weights = {h["epoch"]: h["weights_sha256"] for h in train["history"]}
    assert out["best"]["epoch"] == train["selected_checkpoint"]["epoch"] == 2 and out["last"]["epoch"] == 3
    assert out["best"]["checkpoint"] == "model_selected" and out["best"]["weights_sha256"] == weights[2]
    assert out["best"]["selected_on"] == {"benchmark": "docci", "metric": "mean_r1"}
    assert out["last"]["checkpoint"] == "model" and out["last"]["weights_sha256"] == weights[3]
    assert loaded == [str(paths.run_selected_model(run_id)), str(paths.run_model(run_id))]
    assert out["best"]["metrics"]["n"] == 24 and [e["epoch"] for e in out["per_epoch"]] == [2, 3]
    recorded = out["provenance"]["inputs"]["model_selected"]
    assert recorded["sha256"] == train["outputs"]["model_selected"]["sha256"] == sha256_file(recorded["path"])

    shutil.copy(paths.run_model(run_id), paths.run_selected_model(run_id))
    with pytest.raises(StaleArtifactError, match=f"selected checkpoint was replaced; retrain {run_id}"):
        evaluate_run(reg, run_id, "long_dci")


def test_a7_says_which_checkpoint_and_lineage_and_audit_follow_it(a7_project):
    reg, run_id = a7_project["reg"], a7_project["run_id"]
    evaluation = evaluate_run(reg, run_id, "long_dci")
    build.build_table(reg, "tableA7")
    markdown = paths.table("tableA7", "md").read_text()
    note = next(line for line in markdown.splitlines() if line.startswith("Transfer cells:"))
    hn_clip = reg.params["methods"]["hn_clip"]["label"]
    assert "checkpoint selected on the run's own training benchmark by mean R@1" in note
    assert f"{hn_clip}, trained on DOCCI: epoch 2 on DOCCI" in note
    assert f"% {note}" in paths.table("tableA7", "tex").read_text()

    chain = lineage(paths.table("tableA7", "csv"), "hn_clip/long_dci/t2i/R@1")
    checkpoint, = [node for node in iter_nodes(chain) if node["step"] == "checkpoint"]
    assert checkpoint["path"] == str(paths.run_selected_model(run_id)) and checkpoint["verified"] is True
    assert checkpoint["facts"]["selected_epoch"] == 2 and checkpoint["facts"]["checkpoint"] == "model_selected"

    auditor = Auditor(paths.RESULTS.parent.resolve())
    record = read_json(evaluation)
    check_evaluation(auditor, str(evaluation), record)
    assert auditor.result.mismatches == []
    record["best"]["epoch"] = 3  # a transfer record claiming another epoch than the run selected
    check_evaluation(auditor, str(evaluation), record)
    assert [m.message for m in auditor.result.mismatches] == [
        f"best is not the checkpoint {paths.run_record(run_id)} selected (epoch 2)"]


def test_a_table_refuses_a_transfer_record_encoded_from_the_last_epoch(a7_project):
    reg, run_id = a7_project["reg"], a7_project["run_id"]
    path = evaluate_run(reg, run_id, "long_dci")
    record = read_json(path)
    del record["best"]["selected_on"]  # what the evaluation wrote before transfer cells used the selected one
    path.write_text(json.dumps(record))
    with pytest.raises(StaleArtifactError, match=f"rerun `hnclip evaluate --run {run_id} --benchmark long_dci`"):
        tables.transfer_note(reg, "tableA7")
    assert tables.transfer_note(reg, "table1") is None  # in-domain cells only


def test_a10_note_names_each_rows_epochs_over_seeds(params, tmp_path, monkeypatch):
    params["profiles"]["tiny"]["table_seeds"] = {"tableA10": [42, 43]}
    reg = Registry(params, validate=False)
    monkeypatch.chdir(tmp_path)
    for cell in reg.cells("tableA10"):
        if cell.run_id and cell.train_set and cell.benchmark not in reg.eval_benchmarks(cell.train_set):
            _write_record(cell, reg, epoch=2 if cell.seed == 42 else 3)
    note = tables.transfer_note(reg, "tableA10")
    hn_clip = reg.params["methods"]["hn_clip"]["label"]
    assert f"{hn_clip}, DCI → DOCCI: epochs 2/3 on DCI (seeds 42/43)" in note
    assert f"{hn_clip}, DOCCI → DCI: epochs 2/3 on DOCCI (seeds 42/43)" in note
