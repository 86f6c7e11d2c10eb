"""The audit's DVC claims: does dvc.lock still hold? With DVC installed, what `dvc status` reports;
without it, the md5 of every plain file dvc.lock records."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from hnclip.hashing import hash_file, json_sha256
from hnclip.provenance.audit_claims import Auditor, Mismatch


def _lock_entries(lock: dict) -> dict[str, str]:
    """path -> md5 of every dep and out dvc.lock records (".dir" hashes for directories)."""
    entries = {}
    for stage in lock.get("stages", {}).values():
        for entry in stage.get("deps", []) + stage.get("outs", []):
            if "md5" in entry:
                entries[entry["path"]] = entry["md5"]
    return entries


def _actual_md5(root: Path, path: str) -> str:
    file = root / path
    if not file.exists():
        return "missing"
    if file.is_file():
        return f"md5:{hash_file(file, ('md5',))['md5']}"
    return "changed (per dvc status)"  # DVC's directory hash: dvc status computes it


def dvc_available() -> bool:
    return importlib.util.find_spec("dvc") is not None


def check_dvc(auditor: Auditor) -> None:
    lock_file = auditor.root / "dvc.lock"
    if not lock_file.is_file():
        auditor.result.notes.append("no dvc.lock: nothing to compare with DVC")
        return
    lock = yaml.safe_load(lock_file.read_text()) or {}
    if not dvc_available():
        _check_dvc_lock_files(auditor, lock)
        return
    proc = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], cwd=auditor.root, capture_output=True,
                          text=True, env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    auditor.result.value_checks += 1
    if proc.returncode != 0:
        auditor.add(Mismatch("dvc.lock", "dvc.lock", None, "unknown",
                             f"`dvc status` failed: {proc.stderr.strip()[-500:]}"))
        return
    status = json.loads(proc.stdout or "{}")
    for stage, changes in status.items():
        for change in changes:
            for mismatch in _dvc_change(auditor.root, stage, change, lock):
                auditor.add(mismatch)


def _params_mismatch(root: Path, stage: str, path: str, state: dict, lock: dict) -> Mismatch:
    """A params file dvc status reports as changed: digests of the locked and current values."""
    locked = lock.get("stages", {}).get(stage, {}).get("params", {}).get(path, {})
    current_file = root / path
    current = yaml.safe_load(current_file.read_text()) if current_file.is_file() else {}
    keys = sorted(state)
    return Mismatch("dvc.lock", path, json_sha256({k: locked.get(k) for k in keys}),
                    json_sha256({k: _dotted(current or {}, k) for k in keys}) if current_file.is_file() else "missing",
                    f"stage {stage}: {path} params changed since the last dvc repro "
                    f"({', '.join(f'{k} {state[k]}' for k in keys)}): params changed without rerun")


def _dotted(params: dict, key: str):
    """A params value by DVC's key, which may be a dotted path (`profiles.tiny.recipe`), as dvc.lock stores it."""
    value = params
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _dvc_change(root: Path, stage: str, change, lock: dict) -> list[Mismatch]:
    """One `dvc status` entry ({"changed deps": {...}}, {"changed outs": {...}}, "changed command")."""
    if isinstance(change, str):
        return [Mismatch("dvc.lock", stage, None, "unknown", f"stage {stage}: {change} since the last dvc repro")]
    entries = _lock_entries(lock)
    found = []
    for kind, paths in change.items():
        for path, state in paths.items():
            if isinstance(state, dict):  # a params file: {key: "modified"}
                found.append(_params_mismatch(root, stage, path, state, lock))
                continue
            recorded = entries.get(path)
            found.append(Mismatch("dvc.lock", path, f"md5:{recorded}" if recorded else None,
                                  _actual_md5(root, path),
                                  f"stage {stage}: {kind.replace('changed ', '')[:-1]} {path} is {state}: it no longer "
                                  f"matches the md5 dvc.lock records"))
    return found


def _check_dvc_lock_files(auditor: Auditor, lock: dict) -> None:
    """Without DVC installed: plain files' md5 only (DVC's md5 of a file is md5 of its bytes)."""
    skipped = 0
    for path, recorded in _lock_entries(lock).items():
        if recorded.endswith(".dir"):
            skipped += 1
            continue
        actual = _actual_md5(auditor.root, path)
        auditor.result.value_checks += 1
        if actual != f"md5:{recorded}":
            auditor.add(Mismatch("dvc.lock", path, f"md5:{recorded}", actual,
                                 f"{path} no longer matches the md5 dvc.lock records"))
    if skipped:
        auditor.result.notes.append(f"dvc is not installed: {skipped} directory hash(es) in dvc.lock not checked")
