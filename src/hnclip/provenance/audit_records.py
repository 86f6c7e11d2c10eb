"""What an audit reads: the records the pipeline wrote, the `.complete` markers of the downloads and
params.yaml. A record that no longer parses is a mismatch of its own."""
from __future__ import annotations

from pathlib import Path

from hnclip.config.registry import Registry
from hnclip.io import read_json
from hnclip.provenance.audit_claims import Auditor, Mismatch
from hnclip.provenance.lineage import dataset_record_path, provenance_of, resolve

RECORDS = {  # the records the pipeline writes, by kind (in the order run_audit unpacks them)
    "backbones": "results/backbones/*/train.json",
    "runs": "results/runs/*/train.json",
    "evaluations": "results/evals/*/*.json",
    "stats": "results/stats/*.json",
    "tables": "results/tables/*.provenance.json",
}


def _relative(root: Path, path: Path) -> str:
    return str(path.relative_to(root))


def _read_record(auditor: Auditor, path: Path) -> dict | None:
    """A record, or None (reported) when it no longer parses: hand edits can break JSON too."""
    try:
        return read_json(path)
    except ValueError as exc:
        artifact = _relative(auditor.root, path)
        auditor.add(Mismatch(artifact, artifact, None, auditor.sha256(path), f"is not valid JSON: {exc}"))
        return None


def read_if_valid(root: Path, path: str) -> dict | None:
    """A record another record points at; None if missing or broken (reported by its own checks)."""
    try:
        return read_json(resolve(root, path))
    except (OSError, ValueError):
        return None


def records(auditor: Auditor, paths) -> list[tuple[str, dict]]:
    """(artifact, record) of each path that parses, sorted."""
    read = ((_relative(auditor.root, p), _read_record(auditor, p)) for p in sorted(paths))
    return [(artifact, record) for artifact, record in read if record is not None]


def _has_file_claims(record) -> bool:
    inputs = provenance_of(record).get("inputs") if isinstance(record, dict) else None
    return isinstance(inputs, dict) and all(isinstance(e, dict) and "sha256" in e for e in inputs.values())


def other_records(auditor: Auditor, seen: set[Path]) -> list[tuple[str, dict]]:
    """Any other record under results/ with provenance (overlap reports, derived tables...)."""
    unseen = [p for p in auditor.root.glob("results/**/*.json") if p not in seen]
    return [(artifact, record) for artifact, record in records(auditor, unseen) if _has_file_claims(record)]


def dataset_records(auditor: Auditor, params: dict | None, manifests: set[str]) -> list[tuple[str, dict]]:
    """dataset.json of every profile's data root, and next to every manifest a record names."""
    root, found = auditor.root, set()
    for profile in (params or {}).get("profiles", {}).values():
        found.update(root.glob(f"{profile['data_root']}/*/dataset.json"))
    found.update(p for p in (dataset_record_path(resolve(root, m)) for m in manifests) if p.is_file())
    return records(auditor, found)


def download_markers(root: Path, params: dict | None) -> list[Path]:
    """The `.complete` marker of every file `hnclip download` verified, in every profile's data root."""
    roots = {profile["data_root"] for profile in (params or {}).get("profiles", {}).values()}
    return sorted(marker for data_root in roots for marker in root.glob(f"{data_root}/*/raw/*.complete"))


def check_downloads(auditor: Auditor, markers: list[Path]) -> None:
    for marker in markers:
        artifact = _relative(auditor.root, marker)
        recorded = (read_if_valid(auditor.root, artifact) or {}).get("sha256")
        auditor.file_claim(artifact, artifact[: -len(".complete")], recorded, "downloaded file")


def manifests_named(found: list[tuple[str, dict]]) -> set[str]:
    return {entry["path"] for _, record in found for name, entry in provenance_of(record).get("inputs", {}).items()
            if "manifest" in name}


def load_registry(root: Path, auditor: Auditor) -> Registry | None:
    from hnclip.config.params import ParamsError, load_params
    try:
        return Registry(load_params(root / "params.yaml"), validate=False)
    except (ParamsError, KeyError) as exc:
        auditor.add(Mismatch("params.yaml", "params.yaml", None, auditor.sha256("params.yaml"),
                             f"cannot be loaded, so params could not be compared: {exc}"))
        return None
