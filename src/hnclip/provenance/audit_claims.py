"""The claims an audit checks, and what it found: a record's file hashes (each file re-hashed once per
audit) and values one record copied from another. Every failed claim is one `Mismatch`."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from hnclip.hashing import json_sha256, sha256_file
from hnclip.provenance.lineage import provenance_of, resolve

VALUE_TOLERANCE = 1e-6  # records store float32 recalls as JSON floats


@dataclass(frozen=True)
class Mismatch:
    artifact: str                # the record whose claim failed (or dvc.lock, params.yaml)
    path: str                    # the path that claim is about
    recorded_sha256: str | None  # what the record says (for value/params claims: sha256 of its JSON)
    actual_sha256: str           # what is there now, or "missing"
    message: str

    def __str__(self) -> str:
        return f"{self.artifact}: {self.message}"


@dataclass
class AuditResult:
    mismatches: list[Mismatch] = field(default_factory=list)
    files: dict[str, bool] = field(default_factory=dict)  # every file hashed -> all its claims held
    value_checks: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def verified(self) -> int:
        return sum(self.files.values())


def _short(sha: str | None) -> str:
    if not sha:
        return "none"
    return sha if sha == "missing" else sha[:12]


class Auditor:
    """Collects claims as they are checked: hashes of files, and values copied between records."""

    def __init__(self, root: Path):
        self.root = root
        self.result = AuditResult()
        self.recorded_outputs: dict[str, str] = {}  # sha256 -> the path whose record made it (swap detection)
        self._hashes: dict[Path, str] = {}

    def sha256(self, path: str | Path) -> str:
        """The file's sha256 as read now (or "missing"): hashed once per audit, never taken from a
        marker or from a memo keyed by size and mtime, which a content change can leave intact."""
        file = resolve(self.root, path)
        if file not in self._hashes:
            self._hashes[file] = sha256_file(file) if file.is_file() else "missing"
        return self._hashes[file]

    def add(self, mismatch: Mismatch) -> None:
        self.result.mismatches.append(mismatch)

    def file_claim(self, artifact: str, path: str, recorded: str | None, what: str) -> None:
        actual = self.sha256(path)
        held = actual == recorded
        self.result.files[path] = self.result.files.get(path, True) and held
        if not held:
            self.add(Mismatch(artifact, path, recorded, actual, self._describe(what, path, recorded, actual)))

    def _describe(self, what: str, path: str, recorded: str | None, actual: str) -> str:
        if actual == "missing":
            return f"{what} {path} is missing (recorded sha256 {_short(recorded)})"
        text = (f"{what} {path} changed since the record was written "
                f"(recorded sha256 {_short(recorded)}, now {_short(actual)})")
        other = self.recorded_outputs.get(actual)
        if other and other != path:
            text += f"; its content is now that of {other}"
        return text

    def value_claim(self, artifact: str, path: str, recorded, actual, message: str) -> None:
        self.result.value_checks += 1
        if recorded != actual:
            self.add(Mismatch(artifact, path, json_sha256(recorded), json_sha256(actual), message))


def spec_diff(recorded, current, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ: "recipe.lr: 0.0001 -> 0.0002"."""
    if isinstance(recorded, dict) and isinstance(current, dict):
        return [line for key in sorted(set(recorded) | set(current), key=str)
                for line in spec_diff(recorded.get(key), current.get(key), f"{prefix}{key}.")]
    if recorded != current:
        return [f"{prefix.rstrip('.')}: {json.dumps(recorded)} -> {json.dumps(current)}"]
    return []


def _output_entries(prov: dict) -> list[tuple[str, str, str]]:
    """(name, path, sha256): training records store {name: {path, sha256}}, tables {path: sha256}."""
    entries = []
    for name, entry in prov.get("outputs", {}).items():
        if isinstance(entry, dict):
            entries.append((name, entry["path"], entry["sha256"]))
        else:
            entries.append((name, name, entry))
    return entries


def remember_outputs(auditor: Auditor, records: list[tuple[str, dict]]) -> None:
    """Note which record made each output, so that a file swapped for another is named as such."""
    for _, record in records:
        for _, path, sha in _output_entries(provenance_of(record)):
            auditor.recorded_outputs.setdefault(sha, path)


def check_files(auditor: Auditor, artifact: str, record: dict) -> None:
    prov = provenance_of(record)
    for name, entry in sorted(prov.get("inputs", {}).items()):
        auditor.file_claim(artifact, entry["path"], entry.get("sha256"), f"input {name}:")
    for name, path, sha in _output_entries(prov):
        auditor.file_claim(artifact, path, sha, f"output {name}:" if name != path else "output")
