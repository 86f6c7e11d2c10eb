"""Audit: do the records still describe what is on disk, what params.yaml asks for, and dvc.lock?

Re-hashes every input and output a record names (dataset, training, backbone, evaluation, stats
and table records) and every downloaded file against its `.complete` marker: loads trust a marker
whose size and mtime still match (the 1.7 GB Long-CLIP checkpoint is not re-hashed per load), so
the audit is where a file changed behind its marker's back is caught. Checks the numbers each
record copied from another (table cells from evaluations, evaluations from the training history,
a transfer cell's checkpoint from the one its run selected), compares each run's and table's
params with the current params.yaml (params changed without rerun), and asks DVC whether its lock
still holds. Every failed claim is one `Mismatch`; `main_audit` prints them, or a summary when
there are none.

The parts: the claims and what was found (`audit_claims`), the records read (`audit_records`), the
checks of training and evaluation records (`audit_runs`), of tables (`audit_tables`) and of dvc.lock
(`audit_dvc`); this module runs them in order.
"""
from __future__ import annotations

import sys
from pathlib import Path

from hnclip.config.registry import Registry
from hnclip.provenance.audit_claims import Auditor, AuditResult, Mismatch, check_files, remember_outputs
from hnclip.provenance.audit_dvc import check_dvc
from hnclip.provenance.audit_records import (
    RECORDS,
    check_downloads,
    dataset_records,
    download_markers,
    load_registry,
    manifests_named,
    other_records,
    records,
)
from hnclip.provenance.audit_runs import check_backbones, check_evaluation, check_runs
from hnclip.provenance.audit_tables import check_tables


def run_audit(root: str | Path = Path("."), reg: Registry | None = None) -> AuditResult:
    """The whole audit, with counts for the summary."""
    root = Path(root)
    auditor = Auditor(root)
    reg = reg or load_registry(root, auditor)
    found = {kind: sorted(root.glob(pattern)) for kind, pattern in RECORDS.items()}
    backbones, runs, evaluations, stats, tables = (records(auditor, found[kind]) for kind in RECORDS)
    datasets = dataset_records(auditor, reg.params if reg else None, manifests_named(backbones + runs + evaluations))
    others = other_records(auditor, {path for paths in found.values() for path in paths})
    remember_outputs(auditor, backbones + runs + tables)
    for artifact, record in datasets + stats + others:
        check_files(auditor, artifact, record)
    check_downloads(auditor, download_markers(root, reg.params if reg else None))
    check_backbones(auditor, backbones, reg)
    check_runs(auditor, runs, reg)
    for artifact, record in evaluations:
        check_evaluation(auditor, artifact, record)
    check_tables(auditor, tables, reg)
    check_dvc(auditor)
    return auditor.result


def audit(root: str | Path = Path("."), reg: Registry | None = None) -> list[Mismatch]:
    """Every recorded claim that no longer holds (empty: the project is what its records say)."""
    return run_audit(root, reg).mismatches


def main_audit(root: str | Path = Path("."), reg: Registry | None = None) -> int:
    """Print each mismatch and return 1, or a one-line summary and return 0."""
    result = run_audit(root, reg)
    for mismatch in result.mismatches:
        print(f"MISMATCH {mismatch}", file=sys.stderr)
    for note in result.notes:
        print(f"note: {note}")
    if result.mismatches:
        print(f"audit failed: {len(result.mismatches)} mismatch(es)", file=sys.stderr)
        return 1
    print(f"audit ok: {result.verified} artifacts verified ({result.value_checks} value, params and DVC checks)")
    return 0
