"""Claims of the table records: each cell is the number its evaluation holds for the selected epoch,
the table's params are what params.yaml now has, and its runs are the runs params.yaml now asks for."""
from __future__ import annotations

from pathlib import Path

from hnclip.config.registry import Registry
from hnclip.hashing import json_sha256
from hnclip.provenance.audit_claims import VALUE_TOLERANCE, Auditor, Mismatch, check_files, spec_diff
from hnclip.provenance.audit_records import read_if_valid


def _check_table_cells(auditor: Auditor, artifact: str, record: dict) -> None:
    """Each per-seed number must be the one its evaluation file holds for the selected epoch."""
    selection = record.get("selection", "best")
    evaluations: dict[str, dict | None] = {}
    for cell in record.get("cells", []):
        path = cell.get("eval_file")
        if not path or cell.get("value") is None:
            continue  # a row marked not implemented yet, or a table not built from evaluations
        if path not in evaluations:
            evaluations[path] = read_if_valid(auditor.root, path)
        evaluation = evaluations[path]
        if evaluation is None:
            continue  # reported as a missing or changed input
        chosen = evaluation.get(selection, {})
        actual = (chosen.get("epoch"), chosen.get("metrics", {}).get(cell["direction"], {}).get(cell["metric"]))
        recorded = (cell["epoch"], cell["value"])
        auditor.result.value_checks += 1
        if recorded[0] != actual[0] or actual[1] is None or abs(recorded[1] - actual[1]) > VALUE_TOLERANCE:
            auditor.add(Mismatch(artifact, path, json_sha256(recorded), json_sha256(actual),
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


def _check_table_params(auditor: Auditor, artifact: str, record: dict, reg: Registry) -> None:
    name = record.get("table")
    current = _current_table_params(record, reg)
    recorded = {key: record["params"][key] for key in current}
    auditor.value_claim(artifact, "params.yaml", recorded, current,
                        f"table {name} was built with other params than params.yaml now has "
                        f"(changed without rerun): {'; '.join(spec_diff(recorded, current))}")
    if current.get("table") is not None and any(c.get("eval_file") for c in record.get("cells", [])):
        _check_table_runs(auditor, artifact, record, reg)


def _check_table_runs(auditor: Auditor, artifact: str, record: dict, reg: Registry) -> None:
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
        auditor.add(Mismatch(artifact, "params.yaml", json_sha256(old_spec) if old else None,
                             json_sha256(new_spec) if new else "missing",
                             _run_change_message(key, old, new, old_spec, new_spec)))


def _recorded_spec(root: Path, run_id: str | None) -> dict | None:
    record = read_if_valid(root, f"results/runs/{run_id}/train.json") if run_id else None
    return record.get("spec") if record else None


def _run_change_message(key: tuple, old: str | None, new: str | None, old_spec, new_spec) -> str:
    row, benchmark, seed = key
    cell = f"cell {row} {benchmark} seed {seed}"
    if new is None:
        return f"{cell}: params.yaml no longer asks for it; rerun the table"
    if old is None:
        return f"{cell}: params.yaml asks for it but the table lacks it; rerun the pipeline"
    diff = spec_diff(old_spec, new_spec) if old_spec is not None else []
    change = f" ({'; '.join(diff)})" if diff else ""
    return (f"{cell}: table built from run {old}, but params.yaml (through the current registry code) now gives "
            f"run {new}{change}: params changed without rerun")


def check_tables(auditor: Auditor, tables: list[tuple[str, dict]], reg: Registry | None) -> None:
    for artifact, record in tables:
        check_files(auditor, artifact, record)
        _check_table_cells(auditor, artifact, record)
        if reg is not None:
            _check_table_params(auditor, artifact, record, reg)
