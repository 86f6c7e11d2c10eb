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
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from hnclip.config.registry import Registry
from hnclip.hashing import hash_file, json_sha256, sha256_file
from hnclip.io import read_json
from hnclip.provenance.lineage import (
    dataset_record_path,
    provenance_of,
    resolve,
)

VALUE_TOLERANCE = 1e-6  # records store float32 recalls as JSON floats
RECORDS = {  # the records the pipeline writes, by kind (in the order run_audit unpacks them)
    "backbones": "results/backbones/*/train.json",
    "runs": "results/runs/*/train.json",
    "evaluations": "results/evals/*/*.json",
    "stats": "results/stats/*.json",
    "tables": "results/tables/*.provenance.json",
}


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


def _digest(value) -> str:
    return json_sha256(value)


def _short(sha: str | None) -> str:
    if not sha:
        return "none"
    return sha if sha == "missing" else sha[:12]


class _Auditor:
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
            self.add(Mismatch(artifact, path, _digest(recorded), _digest(actual), message))


# ---- what the project holds -----------------------------------------------------------------------
def _relative(root: Path, path: Path) -> str:
    return str(path.relative_to(root))


def _read_record(auditor: _Auditor, path: Path) -> dict | None:
    """A record, or None (reported) when it no longer parses: hand edits can break JSON too."""
    try:
        return read_json(path)
    except ValueError as exc:
        artifact = _relative(auditor.root, path)
        auditor.add(Mismatch(artifact, artifact, None, auditor.sha256(path), f"is not valid JSON: {exc}"))
        return None


def _read_if_valid(root: Path, path: str) -> dict | None:
    """A record another record points at; None if missing or broken (reported by its own checks)."""
    try:
        return read_json(resolve(root, path))
    except (OSError, ValueError):
        return None


def _records(auditor: _Auditor, paths) -> list[tuple[str, dict]]:
    read = ((_relative(auditor.root, p), _read_record(auditor, p)) for p in sorted(paths))
    return [(artifact, record) for artifact, record in read if record is not None]


def _has_file_claims(record) -> bool:
    inputs = provenance_of(record).get("inputs") if isinstance(record, dict) else None
    return isinstance(inputs, dict) and all(isinstance(e, dict) and "sha256" in e for e in inputs.values())


def _other_records(auditor: _Auditor, seen: set[Path]) -> list[tuple[str, dict]]:
    """Any other record under results/ with provenance (overlap reports, derived tables...)."""
    unseen = [p for p in auditor.root.glob("results/**/*.json") if p not in seen]
    return [(artifact, record) for artifact, record in _records(auditor, unseen) if _has_file_claims(record)]


def _dataset_records(auditor: _Auditor, params: dict | None, manifests: set[str]) -> list[tuple[str, dict]]:
    """dataset.json of every profile's data root, and next to every manifest a record names."""
    root, found = auditor.root, set()
    for profile in (params or {}).get("profiles", {}).values():
        found.update(root.glob(f"{profile['data_root']}/*/dataset.json"))
    found.update(p for p in (dataset_record_path(resolve(root, m)) for m in manifests) if p.is_file())
    return _records(auditor, found)


def _download_markers(root: Path, params: dict | None) -> list[Path]:
    """The `.complete` marker of every file `hnclip download` verified, in every profile's data root."""
    roots = {profile["data_root"] for profile in (params or {}).get("profiles", {}).values()}
    return sorted(marker for data_root in roots for marker in root.glob(f"{data_root}/*/raw/*.complete"))


def _check_downloads(auditor: _Auditor, markers: list[Path]) -> None:
    for marker in markers:
        artifact = _relative(auditor.root, marker)
        recorded = (_read_if_valid(auditor.root, artifact) or {}).get("sha256")
        auditor.file_claim(artifact, artifact[: -len(".complete")], recorded, "downloaded file")


def _manifests_named(records: list[tuple[str, dict]]) -> set[str]:
    return {entry["path"] for _, record in records for name, entry in provenance_of(record).get("inputs", {}).items()
            if "manifest" in name}


def _load_registry(root: Path, auditor: _Auditor) -> Registry | None:
    from hnclip.config.params import ParamsError, load_params
    try:
        return Registry(load_params(root / "params.yaml"), validate=False)
    except (ParamsError, KeyError) as exc:
        auditor.add(Mismatch("params.yaml", "params.yaml", None, auditor.sha256("params.yaml"),
                             f"cannot be loaded, so params could not be compared: {exc}"))
        return None


# ---- claims of each record ------------------------------------------------------------------------
def _output_entries(prov: dict) -> list[tuple[str, str, str]]:
    """(name, path, sha256): training records store {name: {path, sha256}}, tables {path: sha256}."""
    entries = []
    for name, entry in prov.get("outputs", {}).items():
        if isinstance(entry, dict):
            entries.append((name, entry["path"], entry["sha256"]))
        else:
            entries.append((name, name, entry))
    return entries


def _remember_outputs(auditor: _Auditor, records: list[tuple[str, dict]]) -> None:
    for _, record in records:
        for _, path, sha in _output_entries(provenance_of(record)):
            auditor.recorded_outputs.setdefault(sha, path)


def _check_files(auditor: _Auditor, artifact: str, record: dict) -> None:
    prov = provenance_of(record)
    for name, entry in sorted(prov.get("inputs", {}).items()):
        auditor.file_claim(artifact, entry["path"], entry.get("sha256"), f"input {name}:")
    for name, path, sha in _output_entries(prov):
        auditor.file_claim(artifact, path, sha, f"output {name}:" if name != path else "output")


def _spec_diff(recorded, current, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ: "recipe.lr: 0.0001 -> 0.0002"."""
    if isinstance(recorded, dict) and isinstance(current, dict):
        return [line for key in sorted(set(recorded) | set(current), key=str)
                for line in _spec_diff(recorded.get(key), current.get(key), f"{prefix}{key}.")]
    if recorded != current:
        return [f"{prefix.rstrip('.')}: {json.dumps(recorded)} -> {json.dumps(current)}"]
    return []


def _check_run_spec(auditor: _Auditor, artifact: str, record: dict, expected: dict | None) -> None:
    """The spec must still hash to its recorded hash, and equal what params.yaml gives that run."""
    spec, spec_hash = record.get("spec"), record.get("spec_hash")
    auditor.value_claim(artifact, artifact, spec_hash, _digest(spec),  # run ids hash the canonical spec
                        "spec does not hash to the recorded spec_hash: the record was edited")
    if expected is not None:
        diff = _spec_diff(spec, expected)
        auditor.value_claim(artifact, artifact, spec, expected,
                            f"spec differs from what params.yaml now gives this run: {'; '.join(diff)}")


def _check_runs(auditor: _Auditor, runs: list[tuple[str, dict]], reg: Registry | None) -> None:
    known = reg.runs() if reg else {}
    stale = 0
    for artifact, record in runs:
        _check_files(auditor, artifact, record)
        run = known.get(record.get("run_id"))
        if reg is not None and run is None:
            stale += 1  # normal after a params change; only a table built from it is a mismatch
        _check_run_spec(auditor, artifact, record, run.spec if run else None)
    if stale:
        auditor.result.notes.append(f"{stale} run(s) that params.yaml no longer asks for were hash-checked only "
                                    f"(tables built from them are reported)")


def _check_backbones(auditor: _Auditor, backbones: list[tuple[str, dict]], reg: Registry | None) -> None:
    for artifact, record in backbones:
        _check_files(auditor, artifact, record)
        name = Path(artifact).parent.name
        expected = None
        if reg and reg.params["backbones"].get(name, {}).get("kind") == "pretrained_here":
            from hnclip.training.jobs import (
                pretrain_spec,  # imports torch: only when there is a backbone to check
            )
            expected = pretrain_spec(reg, name)
        _check_run_spec(auditor, artifact, record, expected)


def _metrics(metrics: dict | None) -> dict:
    return {d: metrics[d] for d in ("t2i", "i2t") if metrics and d in metrics}


def _close(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[d].keys() == b[d].keys() and all(abs(a[d][k] - b[d][k]) <= VALUE_TOLERANCE for k in a[d]) for d in a)


def _check_evaluation(auditor: _Auditor, artifact: str, record: dict) -> None:
    """Selected-epoch metrics must be the ones the training history recorded for that epoch."""
    _check_files(auditor, artifact, record)
    train_path = provenance_of(record).get("inputs", {}).get("train_record", {}).get("path")
    train_record = _read_if_valid(auditor.root, train_path) if train_path else None
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
            auditor.add(Mismatch(artifact, artifact, _digest(theirs), _digest(ours),
                                 f"{label} metrics differ from what {train_path} recorded for epoch {epoch}: "
                                 f"{'; '.join(_spec_diff(theirs, ours))}"))


def _check_table_cells(auditor: _Auditor, artifact: str, record: dict) -> None:
    """Each per-seed number must be the one its evaluation file holds for the selected epoch."""
    selection = record.get("selection", "best")
    evaluations: dict[str, dict | None] = {}
    for cell in record.get("cells", []):
        path = cell.get("eval_file")
        if not path or cell.get("value") is None:
            continue  # a row marked not implemented yet, or a table not built from evaluations
        if path not in evaluations:
            evaluations[path] = _read_if_valid(auditor.root, path)
        evaluation = evaluations[path]
        if evaluation is None:
            continue  # reported as a missing or changed input
        chosen = evaluation.get(selection, {})
        actual = (chosen.get("epoch"), chosen.get("metrics", {}).get(cell["direction"], {}).get(cell["metric"]))
        recorded = (cell["epoch"], cell["value"])
        auditor.result.value_checks += 1
        if recorded[0] != actual[0] or actual[1] is None or abs(recorded[1] - actual[1]) > VALUE_TOLERANCE:
            auditor.add(Mismatch(artifact, path, _digest(recorded), _digest(actual),
                                 f"cell {cell['row']} {cell['benchmark']}/{cell['direction']}/{cell['metric']} "
                                 f"seed {cell['seed']}: the table has {recorded[1]} (epoch {recorded[0]}) but {path} "
                                 f"now says {actual[1]} (epoch {actual[0]})"))


def _current_table_params(record: dict, reg: Registry) -> dict:
    """What params.yaml now gives for each params key the table recorded (profile; its table spec).
    Tables derived in code (caption geometry, timing) record only the profile."""
    recorded = record.get("params") or {}
    current = {"profile": reg.profile_name}
    if "table" in recorded:
        current["table"] = reg.params["tables"].get(record.get("table"))
    return {key: current[key] for key in recorded if key in current}


def _check_table_params(auditor: _Auditor, artifact: str, record: dict, reg: Registry) -> None:
    name = record.get("table")
    current = _current_table_params(record, reg)
    recorded = {key: record["params"][key] for key in current}
    auditor.value_claim(artifact, "params.yaml", recorded, current,
                        f"table {name} was built with other params than params.yaml now has "
                        f"(changed without rerun): {'; '.join(_spec_diff(recorded, current))}")
    if current.get("table") is not None and any(c.get("eval_file") for c in record.get("cells", [])):
        _check_table_runs(auditor, artifact, record, reg)


def _check_table_runs(auditor: _Auditor, artifact: str, record: dict, reg: Registry) -> None:
    """The runs behind the table must be the runs params.yaml now asks for, cell by cell."""
    built = {(c["row"], c["benchmark"], c["seed"]): c["run_id"] for c in record.get("cells", [])}
    wanted = {(c.row, c.benchmark, c.seed): c.run_id for c in reg.cells(record["table"])}
    reported = set()
    for key in sorted(set(built) | set(wanted), key=str):
        old, new = built.get(key), wanted.get(key)
        auditor.result.value_checks += 1
        if old == new or (old, new) in reported:
            continue
        reported.add((old, new))
        old_spec = _recorded_spec(auditor.root, old)
        new_spec = reg.run(new).spec if new else None
        auditor.add(Mismatch(artifact, "params.yaml", _digest(old_spec) if old else None,
                             _digest(new_spec) if new else "missing",
                             _run_change_message(key, old, new, old_spec, new_spec)))


def _recorded_spec(root: Path, run_id: str | None) -> dict | None:
    record = _read_if_valid(root, f"results/runs/{run_id}/train.json") if run_id else None
    return record.get("spec") if record else None


def _run_change_message(key: tuple, old: str | None, new: str | None, old_spec, new_spec) -> str:
    row, benchmark, seed = key
    cell = f"cell {row} {benchmark} seed {seed}"
    if new is None:
        return f"{cell}: params.yaml no longer asks for it; rerun the table"
    if old is None:
        return f"{cell}: params.yaml asks for it but the table lacks it; rerun the pipeline"
    diff = _spec_diff(old_spec, new_spec) if old_spec is not None else []
    change = f" ({'; '.join(diff)})" if diff else ""
    return (f"{cell}: table built from run {old}, but params.yaml (through the current registry code) now gives "
            f"run {new}{change}: params changed without rerun")


def _check_tables(auditor: _Auditor, tables: list[tuple[str, dict]], reg: Registry | None) -> None:
    for artifact, record in tables:
        _check_files(auditor, artifact, record)
        _check_table_cells(auditor, artifact, record)
        if reg is not None:
            _check_table_params(auditor, artifact, record, reg)


# ---- DVC ----------------------------------------------------------------------------------------
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


def _check_dvc(auditor: _Auditor) -> None:
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
    return Mismatch("dvc.lock", path, _digest({k: locked.get(k) for k in keys}),
                    _digest({k: (current or {}).get(k) for k in keys}) if current_file.is_file() else "missing",
                    f"stage {stage}: {path} params changed since the last dvc repro "
                    f"({', '.join(f'{k} {state[k]}' for k in keys)}): params changed without rerun")


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


def _check_dvc_lock_files(auditor: _Auditor, lock: dict) -> None:
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


# ---- entry points --------------------------------------------------------------------------------
def run_audit(root: str | Path = Path("."), reg: Registry | None = None) -> AuditResult:
    """The whole audit, with counts for the summary."""
    root = Path(root)
    auditor = _Auditor(root)
    reg = reg or _load_registry(root, auditor)
    found = {kind: sorted(root.glob(pattern)) for kind, pattern in RECORDS.items()}
    backbones, runs, evaluations, stats, tables = (_records(auditor, found[kind]) for kind in RECORDS)
    datasets = _dataset_records(auditor, reg.params if reg else None, _manifests_named(backbones + runs + evaluations))
    others = _other_records(auditor, {path for paths in found.values() for path in paths})
    _remember_outputs(auditor, backbones + runs + tables)
    for artifact, record in datasets + stats + others:
        _check_files(auditor, artifact, record)
    _check_downloads(auditor, _download_markers(root, reg.params if reg else None))
    _check_backbones(auditor, backbones, reg)
    _check_runs(auditor, runs, reg)
    for artifact, record in evaluations:
        _check_evaluation(auditor, artifact, record)
    _check_tables(auditor, tables, reg)
    _check_dvc(auditor)
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
