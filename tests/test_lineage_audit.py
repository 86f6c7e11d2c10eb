"""Lineage and audit on a real micro project (built once per session, see helpers.micro_project): a
Table 3a cell traces back to raw data, initial weights and the git commit; each kind of tampering
(on its own copy of the project) is caught and named by the audit; a clean project audits with exit 0."""
import json
import shutil
import subprocess

import pandas as pd
import pytest
import yaml
from helpers.micro_project import copy_project

from hnclip.errors import UnknownNameError
from hnclip.hashing import json_sha256, sha256_file
from hnclip.io import read_json
from hnclip.provenance import audit as audit_module
from hnclip.provenance import audit_dvc
from hnclip.provenance.audit import audit, main_audit, run_audit
from hnclip.provenance.lineage import format_lineage, iter_nodes, lineage, lineage_json

pytestmark = pytest.mark.slow

CELL = "gamma=0.5/docci/t2i/R@1"
TABLE = "results/tables/table3a.provenance.json"
TABLE_CSV = "results/tables/table3a.csv"


def _nodes(chain: dict, step: str) -> list[dict]:
    return [node for node in iter_nodes(chain) if node["step"] == step]


def _git_head(proj) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=proj, capture_output=True, text=True,
                          check=True).stdout.strip()


def _docci_run(proj) -> str:
    return next(c["run_id"] for c in read_json(proj / TABLE)["cells"] if c["benchmark"] == "docci")


# ---- lineage --------------------------------------------------------------------------------------
def test_lineage_of_a_table3a_cell_reaches_raw_data_initial_weights_and_git(micro_project):
    proj = micro_project
    chain = lineage(proj / TABLE_CSV, CELL, root=proj)
    csv = pd.read_csv(proj / TABLE_CSV)
    expected = csv[(csv["row"] == "gamma=0.5") & (csv["column"] == "docci/t2i/R@1")].iloc[0]
    assert chain["facts"]["value"] == pytest.approx(expected["ours_mean"])

    run_id = _docci_run(proj)
    train = read_json(proj / "results/runs" / run_id / "train.json")
    evaluation, = _nodes(chain, "evaluation")
    assert evaluation["path"] == f"results/evals/{run_id}/docci.json" and evaluation["verified"] is True
    checkpoint, = _nodes(chain, "checkpoint")
    assert checkpoint["sha256"] == sha256_file(proj / "results/runs" / run_id / "model.pt")
    epochs = {h["epoch"]: h["weights_sha256"] for h in train["history"]}
    assert checkpoint["facts"]["selected_epoch_weights_sha256"] == epochs[checkpoint["facts"]["selected_epoch"]]
    run, = _nodes(chain, "run")
    assert run["params"] == train["spec"] and run["facts"]["spec_hash"] == train["spec_hash"]

    # manifests -> dataset record -> raw data (the synthetic generator's fingerprint)
    manifests = {n["path"]: n for n in iter_nodes(chain) if n["step"] in ("train manifest", "test manifest")}
    for rel in ("data/embedded/docci/train.jsonl", "data/embedded/docci/test.jsonl"):
        assert manifests[rel]["sha256"] == sha256_file(proj / rel) and manifests[rel]["verified"] is True
    dataset = read_json(proj / "data/embedded/docci/dataset.json")
    raw = [n["facts"] for n in _nodes(chain, "raw data") if n["facts"]["generator"]["variant"] == "docci"]
    assert raw and all(f["generator"]["digest"] == dataset["generator"]["digest"] for f in raw)
    assert all(f["source_sha256"]["distinct"] > 0 for f in raw)

    # initial weights, one level into the backbone pretrained here
    init, = _nodes(chain, "initial weights")
    assert init["path"] == "results/backbones/tiny_pretrained/model.pt"
    assert init["sha256"] == sha256_file(proj / init["path"]) and init["verified"] is True
    backbone, = _nodes(chain, "backbone run")
    assert backbone["facts"]["run_id"].startswith("backbone-tiny_pretrained-")
    assert not _nodes(backbone, "initial weights")  # pretrained from scratch: the chain ends there

    # every record on the way carries the commit the pipeline ran at, and its params
    head = _git_head(proj)
    recorded = [n for n in iter_nodes(chain) if "git" in n]
    assert {n["step"] for n in recorded} >= {"table", "evaluation", "run", "dataset", "backbone run"}
    assert all(n["git"]["commit"] == head and n["git"]["dirty"] is False for n in recorded)
    assert all(n.get("params") for n in recorded)

    assert json.loads(lineage_json(chain)) == json.loads(json.dumps(chain, default=str))
    text = format_lineage(chain)
    for fragment in (f"evaluation: results/evals/{run_id}/docci.json", "initial weights: results/backbones",
                     head[:12], dataset["generator"]["digest"][:16], "[ok]"):
        assert fragment in text
    assert "CHANGED" not in text and "MISSING" not in text


def test_lineage_prints_the_code_each_record_names(micro_project, tmp_path):
    """The run's record names the loop and the function that computed its loss terms (L_HN's file), the
    evaluation record its selection rule and recall function, and the table step its builder; each name
    is code that exists. A record older than these names says so."""
    import importlib

    import hnclip.commands.report as report_command
    import hnclip.losses.objective as objective
    from hnclip.evaluation import retrieval, selection
    from hnclip.report import build, tables
    from hnclip.training import loop

    def resolve(name: str):
        module, _, attribute = name.rpartition(".")
        return getattr(importlib.import_module(module), attribute)

    chain = lineage(micro_project / TABLE_CSV, CELL, root=micro_project)
    run, = _nodes(chain, "run")
    # the function of the run's batch mode (the micro project forwards two micro-batches at once: compute)
    mode = read_json(micro_project / run["path"])["training"]["batch_mode"]
    loss = {"micro": objective.loss_terms, "compute": objective.group_terms}[mode]
    assert {role: resolve(name) for role, name in run["facts"]["code"].items()} == {
        "training": loop.train, "loss_terms": loss, "recall": retrieval.evaluate_model}
    evaluation, = _nodes(chain, "evaluation")
    assert {role: resolve(name) for role, name in evaluation["facts"]["code"].items()} == {
        "selection": selection.select_epochs, "recall": retrieval.evaluate_model}
    table, = _nodes(chain, "table")
    writer = table["facts"]["written_by"].split()[0]
    assert resolve(writer) is build.build_table
    assert {role: resolve(name) for role, name in table["facts"]["code"].items()} == {
        "table": build.build_table, "cells": tables.collect}
    assert "build.build_table(" in open(report_command.__file__).read()  # what `hnclip table` calls
    text = format_lineage(chain)
    for line in (f"code loss_terms: hnclip.losses.objective.{loss.__name__}",
                 "code training: hnclip.training.loop.train",
                 "code selection: hnclip.evaluation.selection.select_epochs",
                 "code recall: hnclip.evaluation.retrieval.evaluate_model",
                 "written_by: hnclip.report.build.build_table (`hnclip table table3a`)"):
        assert line in text, line

    # records written before the code was named
    proj = copy_project(micro_project, tmp_path / "proj", share_weights=True)
    run_id = _docci_run(proj)
    for path in (proj / "results/runs" / run_id / "train.json", proj / "results/evals" / run_id / "docci.json",
                 proj / "results/tables/table3a.provenance.json"):
        record = read_json(path)
        (record.get("provenance") or record).pop("code")
        path.write_text(json.dumps(record))
    old = lineage(proj / TABLE_CSV, CELL, root=proj)
    assert {node["step"]: node["facts"]["code"] for node in iter_nodes(old)
            if node["step"] in ("run", "evaluation", "table")} == {
        "run": "not recorded", "evaluation": "not recorded", "table": "not recorded"}
    assert "code: not recorded" in format_lineage(old)


@pytest.mark.parametrize("table, cell, spec_check", [
    ("table1", "hn_clip/docci/t2i/R@1", lambda spec: spec["objective"]["margin"] == "live"),
    ("table3c", "frozen/docci/i2t/R@1", lambda spec: spec["objective"]["margin"] == "frozen"),
])
def test_lineage_of_table1_and_table3c_cells_reaches_raw_data(micro_project, table, cell, spec_check):
    proj = micro_project
    chain = lineage(proj / f"results/tables/{table}.csv", cell, root=proj)
    run, = _nodes(chain, "run")
    assert spec_check(run["params"]) and run["params"]["train_set"] == "docci"
    dataset = read_json(proj / "data/embedded/docci/dataset.json")
    raw = [n["facts"] for n in _nodes(chain, "raw data") if n["facts"]["generator"]["variant"] == "docci"]
    assert raw and all(f["generator"]["digest"] == dataset["generator"]["digest"] for f in raw)
    init, = _nodes(chain, "initial weights")
    assert init["sha256"] == sha256_file(proj / "results/backbones/tiny_pretrained/model.pt")
    assert "CHANGED" not in format_lineage(chain) and "MISSING" not in format_lineage(chain)


def test_lineage_of_the_zero_shot_row_reaches_the_backbone(micro_project):
    chain = lineage(micro_project / "results/tables/table1.csv", "longclip_zeroshot/docci/t2i/R@1",
                    root=micro_project)
    init, = _nodes(chain, "initial weights")
    assert init["path"] == "results/backbones/tiny_pretrained/model.pt" and init["verified"] is True
    assert _nodes(chain, "test manifest")


def test_lineage_accepts_markdown_labels_and_the_average_column(micro_project):
    proj = micro_project
    by_key = lineage(proj / TABLE_CSV, CELL, root=proj)
    by_label = lineage(proj / "results/tables/table3a.md", "gamma=0.50/DOCCI T→I R@1", root=proj)
    assert by_label["facts"] == by_key["facts"]
    average = lineage(proj / TABLE_CSV, "gamma=0.5/Avg", root=proj)
    values = _nodes(average, "value")
    assert {v["facts"]["benchmark"] for v in values} == {"docci", "dci", "long_dci", "urban1k"}
    assert average["facts"]["value"] == pytest.approx(sum(v["facts"]["value"] for v in values) / len(values))


def test_unknown_cell_names_the_available_rows_and_columns(micro_project):
    with pytest.raises(UnknownNameError) as error:
        lineage(micro_project / TABLE_CSV, "gamma=0.3/docci/t2i/R@1", root=micro_project)
    assert "gamma=0.5" in str(error.value) and "docci/t2i/R@1" in str(error.value)


def _append_a_space(path) -> None:
    with open(path, "a") as handle:
        handle.write(" ")


DAMAGE = {"changed": (_append_a_space, False, "[CHANGED since recorded]"),
          "deleted": (lambda path: path.unlink(), "missing", "[MISSING]")}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("step, target", [("train manifest", "data/embedded/docci/train.jsonl"),
                                          ("checkpoint", "results/runs/{run}/model.pt")])
def test_lineage_marks_a_changed_or_deleted_input(micro_project, tmp_path, step, target, damage):
    proj = copy_project(micro_project, tmp_path / "proj", share_weights=step != "checkpoint")
    target = target.format(run=_docci_run(proj))
    harm, verified, mark = DAMAGE[damage]
    harm(proj / target)
    chain = lineage(proj / TABLE_CSV, CELL, root=proj)
    damaged = [node for node in iter_nodes(chain) if node.get("path") == target]
    assert damaged and all(node["step"] == step and node["verified"] == verified for node in damaged)
    evaluation, = _nodes(chain, "evaluation")
    assert evaluation["verified"] is True  # the rest of the chain is still what was recorded
    text = format_lineage(chain).splitlines()
    assert [line for line in text if f"{step}: {target}" in line and line.endswith(mark)], text
    assert sum(mark in line for line in text) == len(damaged)


# ---- audit ----------------------------------------------------------------------------------------
def _main_audit(proj, monkeypatch) -> tuple[int, list]:
    """`main_audit`'s exit code and the mismatches of the audit it ran (what `audit` returns): one audit,
    and one `dvc status` (a second of CPU), serves the assertions on both."""
    results = []

    def recording(*args, **kwargs):
        results.append(run_audit(*args, **kwargs))
        return results[-1]
    monkeypatch.setattr(audit_module, "run_audit", recording)
    code = main_audit(proj)
    (result,) = results
    return code, result.mismatches


def test_clean_project_audits_with_exit_zero(micro_project, capsys, monkeypatch):
    code, mismatches = _main_audit(micro_project, monkeypatch)
    assert mismatches == []
    assert code == 0
    out = capsys.readouterr().out
    assert "artifacts verified" in out and int(out.split("audit ok: ")[1].split()[0]) > 20


def _edit_eval_number(proj) -> dict:
    run_id = _docci_run(proj)
    path = f"results/evals/{run_id}/docci.json"
    record = read_json(proj / path)
    record["best"]["metrics"]["t2i"]["R@1"] += 12.5
    (proj / path).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return {"path": path, "artifact": TABLE, "also": [(path, path), ("dvc.lock", "results/evals")]}


def _swap_checkpoint(proj) -> dict:
    cells = read_json(proj / TABLE)["cells"]
    victim = next(c["run_id"] for c in cells if c["benchmark"] == "docci")
    donor = next(c["run_id"] for c in cells if c["benchmark"] == "dci")
    path, donor_path = f"results/runs/{victim}/model.pt", f"results/runs/{donor}/model.pt"
    shutil.copy(proj / donor_path, proj / path)
    return {"path": path, "artifact": f"results/runs/{victim}/train.json", "message": donor_path,
            "also": [(f"results/evals/{victim}/docci.json", path), ("dvc.lock", "results/runs")]}


def _edit_test_manifest(proj) -> dict:
    path = "data/embedded/docci/test.jsonl"
    with open(proj / path, "a") as handle:
        handle.write(" ")
    run_id = _docci_run(proj)
    return {"path": path, "artifact": "data/embedded/docci/dataset.json",
            "also": [(f"results/evals/{run_id}/docci.json", path), (f"results/runs/{run_id}/train.json", path)]}


def _change_lr(proj) -> dict:
    params = proj / "params.yaml"
    text = params.read_text()
    lr = yaml.safe_load(text)["profiles"]["tiny"]["recipe"]["lr"]
    line = yaml.safe_dump({"lr": lr})   # as the project's params.yaml was written (safe_dump)
    assert text.count(line) == 1
    params.write_text(text.replace(line, yaml.safe_dump({"lr": 2 * lr})))
    return {"path": "params.yaml", "artifact": TABLE, "message": f"recipe.lr: {lr} -> {2 * lr}",
            "also": [("dvc.lock", "params.yaml")]}


def _edit_table_csv(proj) -> dict:
    path = proj / TABLE_CSV
    frame = pd.read_csv(path)
    frame.loc[0, "ours_mean"] += 1.0
    frame.to_csv(path, index=False)
    return {"path": TABLE_CSV, "artifact": TABLE, "also": [("dvc.lock", "results/tables")]}


TAMPERING = {"tampered metrics": _edit_eval_number, "swapped checkpoint": _swap_checkpoint,
             "edited manifest": _edit_test_manifest, "params changed without rerun": _change_lr,
             "tampered table csv": _edit_table_csv}


@pytest.mark.parametrize("case", list(TAMPERING))
def test_audit_catches_and_names_each_tampering(case, micro_project, tmp_path, capsys, monkeypatch):
    # each case tampers with its own copy; swapping a checkpoint writes into the weights
    proj = copy_project(micro_project, tmp_path / "proj", share_weights=case != "swapped checkpoint")
    expect = TAMPERING[case](proj)
    code, mismatches = _main_audit(proj, monkeypatch)
    named = {(m.artifact, m.path) for m in mismatches}
    assert (expect["artifact"], expect["path"]) in named, [str(m) for m in mismatches]
    for pair in expect["also"]:
        assert pair in named, (pair, [str(m) for m in mismatches])
    main = next(m for m in mismatches if (m.artifact, m.path) == (expect["artifact"], expect["path"]))
    assert expect.get("message", expect["path"]) in main.message
    assert main.recorded_sha256 != main.actual_sha256
    assert code == 1
    assert expect["path"] in capsys.readouterr().err


def test_without_dvc_the_lock_files_md5_are_still_checked(micro_project, tmp_path, monkeypatch):
    proj = copy_project(micro_project, tmp_path / "proj", share_weights=True)
    monkeypatch.setattr(audit_dvc, "dvc_available", lambda: False)
    assert audit(proj) == []
    with open(proj / "Snakefile", "a") as handle:
        handle.write("\n")
    mismatch, = audit(proj)
    assert (mismatch.artifact, mismatch.path) == ("dvc.lock", "Snakefile")
    assert mismatch.recorded_sha256.startswith("md5:") and mismatch.actual_sha256.startswith("md5:")


def test_dvc_params_digest_reads_dotted_keys(tmp_path):
    """dvc.lock names params by dotted path; the current value must be read at that path, not as a top-level key."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"profiles": {"tiny": {"recipe": {"lr": 2e-5}}}}))
    lock = {"stages": {"paper": {"params": {"params.yaml": {"profiles.tiny.recipe": {"lr": 1e-5}}}}}}
    found = audit_dvc._params_mismatch(tmp_path, "paper", "params.yaml", {"profiles.tiny.recipe": "modified"}, lock)
    assert found.recorded_sha256 == json_sha256({"profiles.tiny.recipe": {"lr": 1e-5}})
    assert found.actual_sha256 == json_sha256({"profiles.tiny.recipe": {"lr": 2e-5}})
