"""Claims of the training records (runs, backbones) and of the evaluations made from them: each spec
still hashes to its run id's hash and equals what params.yaml gives that run, and each evaluation's
numbers are the ones the training history recorded."""
from __future__ import annotations

from pathlib import Path

from hnclip.config.registry import Registry, pretrain_spec
from hnclip.hashing import json_sha256
from hnclip.provenance.audit_claims import VALUE_TOLERANCE, Auditor, Mismatch, check_files, spec_diff
from hnclip.provenance.audit_records import read_if_valid
from hnclip.provenance.lineage import provenance_of


def _check_run_spec(auditor: Auditor, artifact: str, record: dict, expected: dict | None) -> None:
    """The spec must still hash to its recorded hash, and equal what params.yaml gives that run."""
    spec, spec_hash = record.get("spec"), record.get("spec_hash")
    auditor.value_claim(artifact, artifact, spec_hash, json_sha256(spec),  # run ids hash the canonical spec
                        "spec does not hash to the recorded spec_hash: the record was edited")
    if expected is not None:
        diff = spec_diff(spec, expected)
        auditor.value_claim(artifact, artifact, spec, expected,
                            f"spec differs from what params.yaml now gives this run: {'; '.join(diff)}")


def check_runs(auditor: Auditor, runs: list[tuple[str, dict]], reg: Registry | None) -> None:
    known = reg.runs() if reg else {}
    stale = 0
    for artifact, record in runs:
        check_files(auditor, artifact, record)
        run = known.get(record.get("run_id"))
        if reg is not None and run is None:
            stale += 1  # normal after a params change; only a table built from it is a mismatch
        _check_run_spec(auditor, artifact, record, run.spec if run else None)
    if stale:
        auditor.result.notes.append(f"{stale} run(s) that params.yaml no longer asks for were hash-checked only "
                                    f"(tables built from them are reported)")


def check_backbones(auditor: Auditor, backbones: list[tuple[str, dict]], reg: Registry | None) -> None:
    for artifact, record in backbones:
        check_files(auditor, artifact, record)
        name = Path(artifact).parent.name
        expected = None
        if reg and reg.params["backbones"].get(name, {}).get("kind") == "pretrained_here":
            expected = pretrain_spec(reg, name)
        _check_run_spec(auditor, artifact, record, expected)


def _metrics(metrics: dict | None) -> dict:
    return {d: metrics[d] for d in ("t2i", "i2t") if metrics and d in metrics}


def _close(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[d].keys() == b[d].keys() and all(abs(a[d][k] - b[d][k]) <= VALUE_TOLERANCE for k in a[d]) for d in a)


def check_evaluation(auditor: Auditor, artifact: str, record: dict) -> None:
    """Selected-epoch metrics must be the ones the training history recorded for that epoch."""
    check_files(auditor, artifact, record)
    train_path = provenance_of(record).get("inputs", {}).get("train_record", {}).get("path")
    train_record = read_if_valid(auditor.root, train_path) if train_path else None
    if train_record is None:
        return  # zero-shot (no training), or a missing/broken record reported on its own
    history = {h["epoch"]: h for h in train_record.get("history", [])}
    benchmark = record.get("benchmark")
    best = record.get("best") or {}
    if best.get("checkpoint") == "model_selected":  # a transfer cell: the checkpoint its run selected
        selected = train_record.get("selected_checkpoint") or {}
        auditor.value_claim(artifact, artifact, [selected.get("epoch"), selected.get("weights_sha256")],
                            [best.get("epoch"), best.get("weights_sha256")],
                            f"best is not the checkpoint {train_path} selected (epoch {selected.get('epoch')})")
    chosen = [("best", record.get("best"))] + [(f"per_epoch {e.get('epoch')}", e) for e in record.get("per_epoch", [])]
    for label, entry in chosen:
        epoch = (entry or {}).get("epoch")
        trained = history.get(epoch, {}).get("eval", {}).get(benchmark)
        if trained is None:
            continue  # not evaluated every epoch: nothing to compare with
        ours, theirs = _metrics(entry["metrics"]), _metrics(trained)
        auditor.result.value_checks += 1
        if not _close(ours, theirs):
            auditor.add(Mismatch(artifact, artifact, json_sha256(theirs), json_sha256(ours),
                                 f"{label} metrics differ from what {train_path} recorded for epoch {epoch}: "
                                 f"{'; '.join(spec_diff(theirs, ours))}"))
