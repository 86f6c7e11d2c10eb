"""Lineage of one table cell, from the number back to the raw data and the initial weights.

    table (+ provenance.json) -> per-seed value -> evaluation record -> checkpoint (model.pt, or a
    transfer cell's model_selected.pt; selected epoch) -> training run (RunSpec, spec hash) ->
    train/test manifests -> dataset record -> raw data (synthetic generator fingerprint, or source
    sha256s + download markers) ; initial weights ->
    the backbone's own training run (one level) ; a baseline's auxiliary inputs (segments, edge maps)
    -> their record -> the models that made them (SAM, CLIP: each downloaded file's sha256)

Every step is a node {"step", "path", "sha256", "verified", "git", "params", "facts", "inputs"}:
`sha256` is what the consuming record recorded, `verified` whether the file still has it (True,
False or "missing"). The chain only reads records; `hnclip.provenance.audit` is the whole-project check.

The code of a number: the run and evaluation nodes' `code` fact is what their records name (the run: the
training loop, the function that computed its loss terms, the recall function; the evaluation: the
selection rule and the recall function), importable names written from the function objects used;
"not recorded" for a record older than these names. The table's record names its builder and the function
that read its cells the same way (`written_by`, `code`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pandas as pd
import yaml

from hnclip.config.cells import AVG, DIRECTION_LABELS, canonical_row, column_key
from hnclip.errors import UnknownNameError, UserError
from hnclip.hashing import (
    file_sha256,
    json_sha256,
)
from hnclip.io import read_json, read_jsonl

AVG_COLUMN = column_key(*AVG)
LISTED_SOURCES = 10  # above this many distinct source_sha256 values, give their count and digest
NOT_RECORDED = "not recorded"
# ---- small helpers shared with hnclip.provenance.audit ------------------------------------------------------

class LineageError(UserError, ValueError):
    """A file that lineage cannot follow (not a built table of evaluated cells)."""


def resolve(root: Path, path: str | Path) -> Path:
    """Recorded paths are relative to the project root the pipeline ran in."""
    path = Path(path)
    return path if path.is_absolute() else root / path


def current_sha256(root: Path, path: str | Path) -> str:
    file = resolve(root, path)
    return file_sha256(file) if file.is_file() else "missing"


def provenance_of(record: dict) -> dict:
    """Evaluation and stats records keep provenance under a key; the others are provenance."""
    return record.get("provenance", record)


def table_name(table_file: Path) -> str:
    return table_file.name.split(".")[0]  # table3a.csv, table3a.md, table3a.provenance.json


def table_provenance_path(table_file: Path) -> Path:
    return table_file.parent / f"{table_name(table_file)}.provenance.json"


def dataset_record_path(manifest: Path) -> Path:
    """`hnclip data` writes dataset.json next to the manifests it made."""
    return manifest.parent / "dataset.json"


# ---- nodes --------------------------------------------------------------------------------------
def _verified(actual: str, recorded: str | None):
    """True/False: the file still has the recorded sha256; None: nothing was recorded for it."""
    if actual == "missing":
        return "missing"
    return None if recorded is None else actual == recorded


def _node(step: str, root: Path, path: str | Path | None = None, sha256: str | None = None,
          record: dict | None = None, params=None, facts: dict | None = None, inputs: list | None = None) -> dict:
    """One step of the chain. `sha256` is the hash its consumer recorded; where none was, the current one."""
    node = {"step": step}
    if path is not None:
        actual = current_sha256(root, path)
        node.update(path=str(path), sha256=sha256 or (None if actual == "missing" else actual),
                    verified=_verified(actual, sha256))
    if record is not None:
        node["git"] = record.get("git")
    if params is not None:
        node["params"] = params
    node["facts"] = facts or {}
    node["inputs"] = inputs or []
    return node


def iter_nodes(chain: dict) -> Iterator[dict]:
    """Every node of a lineage tree, depth first."""
    yield chain
    for child in chain.get("inputs", []):
        yield from iter_nodes(child)


# ---- finding the cell ---------------------------------------------------------------------------
def _benchmark_labels(root: Path) -> dict[str, str]:
    try:
        params = yaml.safe_load((root / "params.yaml").read_text())
        return {name: bench["label"] for name, bench in params["benchmarks"].items()}
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return {}


def _column_aliases(columns: list[str], labels: dict[str, str]) -> dict[str, str]:
    """Column key, and the Markdown header label ("DOCCI T→I R@1", also with "->"), -> column key."""
    aliases = {}
    for column in columns:
        aliases[column] = column
        if column == AVG_COLUMN:
            aliases["Avg"] = column
            continue
        bench, direction, metric = column.split("/")
        arrow = DIRECTION_LABELS.get(direction, direction)
        for shown in (arrow, arrow.replace("→", "->")):
            aliases[f"{labels.get(bench, bench)} {shown} {metric}"] = column
    return aliases


def find_cell(frame: pd.DataFrame, cell: str, labels: dict[str, str]) -> pd.Series:
    """The CSV row of "<row>/<column>"; rows compare by value (gamma=0.50 is gamma=0.5)."""
    rows = list(dict.fromkeys(frame["row"]))
    columns = list(dict.fromkeys(frame["column"]))
    for alias, column in _column_aliases(columns, labels).items():
        if not cell.endswith("/" + alias):
            continue
        row = canonical_row(cell[: -len(alias) - 1])
        hit = frame[(frame["row"].map(canonical_row) == row) & (frame["column"] == column)]
        if not hit.empty:
            return hit.iloc[0]
    raise UnknownNameError(f"no cell {cell!r} in this table; rows: {rows}; columns: {columns} "
                           f"(or their Markdown header labels)")


def _seed_cells(table_record: dict, row: str, column: str) -> list[dict]:
    """The per-seed values behind a cell; the average column stands on every benchmark of its row."""
    cells = [c for c in table_record["cells"] if c["row"] == row and c.get("eval_file")]
    if column != AVG_COLUMN:
        cells = [c for c in cells if column_key(c["benchmark"], c["direction"], c["metric"]) == column]
    return cells


# ---- the chain ----------------------------------------------------------------------------------
def lineage(table_file: str | Path, cell: str, root: str | Path = Path(".")) -> dict:
    """The lineage tree of one cell ("<row>/<column>", e.g. "gamma=0.5/docci/t2i/R@1") of a table.

    `table_file` is any of the table's files (csv, md, tex, provenance.json). Raises
    UnknownNameError naming the available rows and columns for an unknown cell, LineageError for a
    table that is not built or not made of evaluated cells.
    """
    root = Path(root)
    table_file = resolve(root, table_file)
    record_path = table_provenance_path(table_file)
    if not record_path.is_file():
        raise LineageError(f"{record_path} not found: lineage follows a built table; build it first "
                           f"(`hnclip table {table_name(table_file)}`, or the workflow)")
    table_record = read_json(record_path)
    frame = pd.read_csv(table_file.parent / f"{table_name(table_file)}.csv")
    if "column" not in frame or not any(c.get("eval_file") for c in table_record.get("cells", [])):
        raise LineageError(f"{table_file}: lineage follows tables of evaluated cells (row/benchmark/direction/"
                           f"metric); this table is built from other records: see {record_path} inputs")
    found = find_cell(frame, cell, _benchmark_labels(root))
    sources = [_value_node(root, table_record, c) for c in _seed_cells(table_record, found["row"], found["column"])]
    table = _node("table", root, _relative(root, record_path), record=table_record, params=table_record.get("params"),
                  facts={"table": table_record.get("table"), "selection": table_record.get("selection"),
                         "written_by": f"{table_record.get('code', {}).get('table', NOT_RECORDED)} "
                                       f"(`hnclip table {table_record.get('table')}`)",
                         "code": table_record.get("code") or NOT_RECORDED,
                         "created": table_record.get("created"), "outputs": _table_outputs(root, table_record)},
                  inputs=sources)
    return _node("cell", root, facts=_cell_facts(table_record, found), inputs=[table])


def _cell_facts(table_record: dict, found: pd.Series) -> dict:
    mean = found["ours_mean"]
    return {"table": table_record.get("table"), "row": found["row"], "column": found["column"],
            "value": None if pd.isna(mean) else float(mean), "n_seeds": int(found["n_seeds"]),
            "selection": found["selection"], "status": found.get("status", "ok")}


def _relative(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _table_outputs(root: Path, table_record: dict) -> dict:
    return {path: {"sha256": sha, "verified": _verified(current_sha256(root, path), sha)}
            for path, sha in table_record.get("outputs", {}).items()}


def _value_node(root: Path, table_record: dict, cell: dict) -> dict:
    key = f"{cell['run_id']}/{cell['benchmark']}"
    recorded = table_record.get("inputs", {}).get(key, {}).get("sha256")
    evaluation = _evaluation_node(root, cell["eval_file"], recorded, table_record.get("selection", "best"))
    facts = {k: cell[k] for k in ("seed", "benchmark", "direction", "metric", "value", "epoch", "run_id")}
    return _node("value", root, facts=facts, inputs=[evaluation])


def _evaluation_node(root: Path, path: str, recorded: str | None, selection: str) -> dict:
    evaluation = read_json(resolve(root, path))
    prov = provenance_of(evaluation)
    inputs = prov.get("inputs", {})
    chosen = evaluation.get(selection, {})
    facts = {"run_id": evaluation.get("run_id"), "benchmark": evaluation.get("benchmark"), "selection": selection,
             "selected_epoch": chosen.get("epoch"), "selected_weights_sha256": chosen.get("weights_sha256"),
             "consistent_with_training": evaluation.get("consistent_with_training"),
             "code": prov.get("code") or NOT_RECORDED, "created": prov.get("created")}
    weights = _evaluated_weights_node(root, inputs, chosen)
    test = _manifest_node(root, "test manifest", inputs["test_manifest"])
    return _node("evaluation", root, path, recorded, record=prov, params=prov.get("params"), facts=facts,
                 inputs=[weights, test])


def _evaluated_weights_node(root: Path, inputs: dict, chosen: dict) -> dict:
    """A trained run's checkpoint (and its run), or for the zero-shot pseudo-run the initial weights."""
    if "train_record" not in inputs:
        return _init_node(root, inputs["init_weights"], {"init": {"kind": "as released (zero-shot)"}},
                          follow_init=True)
    train_record = read_json(resolve(root, inputs["train_record"]["path"]))
    # the file the selected entry was encoded from (a transfer cell: model_selected); else model.pt
    name = chosen.get("checkpoint", "model")
    checkpoint = _checkpoint_node(root, name, inputs[name], train_record, chosen)
    checkpoint["inputs"].append(_run_node(root, inputs["train_record"], train_record, follow_init=True))
    return checkpoint


def _checkpoint_node(root: Path, name: str, model: dict, train_record: dict, chosen: dict) -> dict:
    weights = {h["epoch"]: h.get("weights_sha256") for h in train_record.get("history", [])}
    run_id, epoch = train_record.get("run_id"), chosen.get("epoch")
    facts = {"checkpoint": name, "selected_epoch": epoch, "selected_on": chosen.get("selected_on"),
             # weights_sha256 hashes the state dict's tensors (provenance.hashing.weights_digest), not a file
             "selected_epoch_weights_sha256": weights.get(epoch),
             "final_epoch": max(weights) if weights else None,
             "final_weights_sha256": train_record.get("final_weights_sha256"),
             "training_record_model_sha256": train_record.get("outputs", {}).get(name, {}).get("sha256")}
    kept = root / ".cache" / "checkpoints" / str(run_id) / f"epoch_{epoch or 0:02d}.pt"
    if epoch and kept.is_file():  # keep_epoch_weights: the selected epoch's own file
        facts["selected_epoch_file"] = {"path": _relative(root, kept), "sha256": file_sha256(kept)}
    return _node("checkpoint", root, model["path"], model.get("sha256"), facts=facts)


def _run_node(root: Path, recorded: dict, train_record: dict, follow_init: bool, step: str = "run") -> dict:
    inputs = []
    for name, entry in sorted(train_record.get("inputs", {}).items()):
        if name == "init_weights":
            inputs.append(_init_node(root, entry, train_record, follow_init))
        elif "manifest" in name:
            inputs.append(_manifest_node(root, name.replace("_", " ").replace(":", " "), entry))
        elif name.startswith("auxiliary:"):  # a baseline's segments or edge maps, and what made them
            inputs.append(_auxiliary_node(root, name.split(":", 1)[1], entry))
    facts = {"run_id": train_record.get("run_id"), "spec_hash": train_record.get("spec_hash"),
             "code": train_record.get("code") or NOT_RECORDED, "device": train_record.get("device"),
             "torch": train_record.get("libraries", {}).get("torch"),
             "optimizer_steps": train_record.get("optimizer_steps"),
             "resumed_from_step": train_record.get("resumed_from_step"), "created": train_record.get("created")}
    return _node(step, root, recorded["path"], recorded.get("sha256"), record=train_record,
                 params=train_record.get("spec"), facts=facts, inputs=inputs)


def _init_node(root: Path, entry: dict, train_record: dict, follow_init: bool) -> dict:
    init = train_record.get("init", {})
    facts = {"kind": init.get("kind"), "model_config": init.get("model_config")}
    inputs = []
    backbone_record = resolve(root, entry["path"]).parent / "train.json"
    if follow_init and backbone_record.is_file() and backbone_record.parent.parent.name == "backbones":
        # a backbone pretrained here is a run of its own: one level into its record
        record = read_json(backbone_record)
        facts["model_sha256_in_backbone_record"] = record.get("outputs", {}).get("model", {}).get("sha256")
        inputs.append(_run_node(root, {"path": _relative(root, backbone_record)}, record, follow_init=False,
                                step="backbone run"))
    marker = _download_marker(resolve(root, entry["path"]))
    if marker:
        facts["download_marker"] = marker
    return _node("initial weights", root, entry["path"], entry.get("sha256"), facts=facts, inputs=inputs)


def _auxiliary_node(root: Path, kind: str, entry: dict) -> dict:
    """An auxiliary input's index (GOAL's segments, StructXLIP's edge maps), into the record written beside
    it: the models it ran (a download record: SAM, the CLIP matcher; or the backbone's weights) and, for
    edge maps, the segments they were cut from. Its training manifest is the run's own (listed there)."""
    index = resolve(root, entry["path"])
    record_file = index.parent / "record.json"
    if not record_file.is_file():
        return _node(f"auxiliary {kind}", root, entry["path"], entry.get("sha256"))
    record = read_json(record_file)
    inputs = []
    for name, input_entry in sorted(record.get("inputs", {}).items()):
        if name.startswith("model:"):
            inputs.append(_model_node(root, name.split(":", 1)[1], input_entry))
        elif name == "segments" and kind != "segments":
            inputs.append(_auxiliary_node(root, "segments", input_entry))
    facts = {"record": _relative(root, record_file), "created": record.get("created"),
             "summary": record.get("summary")}
    return _node(f"auxiliary {kind}", root, entry["path"], entry.get("sha256"), record=record,
                 params=record.get("params"), facts=facts, inputs=inputs)


def _model_node(root: Path, role: str, entry: dict) -> dict:
    """A model an auxiliary step ran: a verified download (its record lists every file with its sha256
    and marker) or weights made here."""
    path = resolve(root, entry["path"])
    if path.name != "download.json" or not path.is_file():
        return _node(f"{role} weights", root, entry["path"], entry.get("sha256"))
    record = read_json(path)
    files = [_node("downloaded file", root, file_entry["path"], file_entry.get("sha256"),
                   facts={"download_marker": _download_marker(resolve(root, file_entry["path"]))})
             for _, file_entry in sorted(record.get("inputs", {}).items())]
    return _node(f"{role} download", root, entry["path"], entry.get("sha256"), record=record,
                 facts={"source": record.get("source")}, inputs=files)


def _download_marker(path: Path) -> dict | None:
    """`hnclip download` leaves <file>.complete (sha256, pinned checksum, url) next to a verified file."""
    marker = path.with_name(path.name + ".complete")
    if not marker.is_file():
        return None
    data = read_json(marker)
    return {"path": str(marker), **{k: data.get(k) for k in ("sha256", "pinned", "url", "size")}}


def _manifest_node(root: Path, step: str, entry: dict) -> dict:
    manifest = resolve(root, entry["path"])
    inputs = []
    dataset_file = dataset_record_path(manifest)
    if dataset_file.is_file():
        inputs.append(_dataset_node(root, dataset_file, manifest))
    return _node(step, root, entry["path"], entry.get("sha256"), inputs=inputs)


def _dataset_node(root: Path, dataset_file: Path, manifest: Path) -> dict:
    record = read_json(dataset_file)
    recorded = {Path(e["path"]).name: e["sha256"] for e in record.get("inputs", {}).values()}
    facts = {"created": record.get("created"),
             "manifest_sha256_in_dataset_record": recorded.get(manifest.name)}
    raw = _raw_data_node(root, record, manifest)
    return _node("dataset", root, _relative(root, dataset_file), record=record, params=record.get("spec"),
                 facts=facts, inputs=[raw])


def _raw_data_node(root: Path, dataset_record: dict, manifest: Path) -> dict:
    spec = dataset_record.get("spec", {})
    facts = {"kind": spec.get("kind")}
    if "generator" in dataset_record:  # synthetic: the fingerprint determines every byte written
        generator = dataset_record["generator"]
        facts["generator"] = {k: generator.get(k) for k in ("digest", "generator", "variant", "seed", "sizes",
                                                            "image_size", "libraries")}
    else:
        raw_dir = manifest.parent.parent / str(spec.get("source", "")) / "raw"
        facts["download_markers"] = {p.name[: -len(".complete")]: _download_marker(p.with_suffix(""))
                                     for p in sorted(raw_dir.glob("*.complete"))}
        facts["counts"] = dataset_record.get("counts")
    if manifest.is_file():
        facts["source_sha256"] = _source_hashes(manifest)
    return _node("raw data", root, facts=facts)


def _source_hashes(manifest: Path) -> dict:
    """The raw files the manifest rows came from (archives, json, or each image)."""
    try:
        values = sorted({row.get("source_sha256") for row in read_jsonl(manifest)} - {None})
    except ValueError as exc:  # an edited manifest: say so rather than stop the whole chain
        return {"error": f"{manifest.name} does not parse: {exc}"}
    summary = {"distinct": len(values)}
    if len(values) <= LISTED_SOURCES:
        summary["values"] = values
    else:
        summary["digest"] = json_sha256(values)
    return summary


# ---- output -------------------------------------------------------------------------------------
def lineage_json(chain: dict) -> str:
    return json.dumps(chain, indent=2, default=str)


def _status(node: dict) -> str:
    """Whether the file still has the sha256 its consumer recorded (blank where none was recorded)."""
    return {True: "  [ok]", False: "  [CHANGED since recorded]", "missing": "  [MISSING]"}.get(node.get("verified"), "")


def _git(git: dict | None) -> str:
    if not git or not git.get("commit"):
        return "git: none"
    return f"git {git['commit'][:12]}{' (dirty)' if git.get('dirty') else ''}"


def _short(value, width: int = 110) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def _marker_summary(marker: dict) -> str:
    how = "checked against the pin" if marker.get("pinned") else "recorded on first verified download, no pin"
    return f"sha256 {marker.get('sha256')} ({how})"


def _node_lines(node: dict, indent: str) -> list[str]:
    head = node["step"]
    if "path" in node:
        head += f": {node['path']}  sha256 {str(node.get('sha256'))[:16]}{_status(node)}"
    lines = [indent + head]
    detail = indent + "    "
    if "git" in node:
        lines.append(detail + _git(node["git"]))
    for key, value in node.get("facts", {}).items():
        if key == "download_markers" and value:  # one line per file: its full sha256 would not fit in one
            lines += [f"{detail}downloaded {name}: {_marker_summary(marker)}" for name, marker in value.items()]
        elif key == "download_marker" and value:
            lines.append(f"{detail}downloaded: {_marker_summary(value)}")
        elif key == "code" and isinstance(value, dict):  # one line per name: they are read in full
            lines += [f"{detail}code {role}: {name}" for role, name in value.items()]
        elif value is not None:
            lines.append(f"{detail}{key}: {_short(value)}")
    if node.get("params") is not None:
        lines.append(f"{detail}params: {_short(node['params'])}")
    for child in node.get("inputs", []):
        lines += _node_lines(child, indent + "  | ")
    return lines


def format_lineage(chain: dict) -> str:
    """A readable indented tree: one line per step, its git state, facts and params beneath."""
    return "\n".join(_node_lines(chain, ""))
