"""What `hnclip evaluate` writes: results/evals/<run>/<benchmark>.json, best and last epoch.

A trained run is evaluated on its in-domain benchmarks after every epoch while it trains (with
the same `hnclip.evaluation.retrieval` code, on the exported weights of that epoch), and its training job
checks that the saved model.pt holds exactly the last epoch's weights. This job therefore only
selects from the training record, after checking that model.pt is still the file the record
names and that the record was evaluated with today's evaluation settings: no model is loaded.
Encoding happens only where nothing was recorded: the zero-shot pseudo-run (the initial backbone
as released) and transfer benchmarks a run was not evaluated on while training. A transfer cell's
`best` is the checkpoint selected on the run's own training benchmark (model_selected.pt: the
model the method would ship, never chosen by its score on the transfer benchmark), its `last` the
final weights; each entry names the checkpoint input it was encoded from.

The record names the code of its numbers (`code` in its provenance, by importable name, from the function
objects used; `hnclip lineage` prints it): `selection`, the rule that picked the epochs
(`hnclip.evaluation.selection.select_epochs`, applied here or, for a transfer cell's checkpoint, by the
training job), and `recall`, the function that computed the Recall@K: as the training record names it
for numbers read from it ("not recorded" where that record is older than these names), or the one this
job encoded with.
"""
from __future__ import annotations

import time
from pathlib import Path

from hnclip import provenance
from hnclip.config import paths
from hnclip.errors import StaleArtifactError
from hnclip.evaluation.selection import select_epochs
from hnclip.io import read_json, write_json

NOT_RECORDED = "not recorded"



def _encoding_recall() -> str:
    """The name of the function `_encode_and_score` computes Recall@K with."""
    from hnclip.evaluation.retrieval import evaluate_model
    return provenance.code_name(evaluate_model)


def _encode_and_score(reg, backbone, manifest) -> dict:
    """Recall@K of `backbone` on a test manifest, in fp32 on the profile's device (a GPU slot)."""
    import torch

    from hnclip.data.loader import PairDataset, loading_options
    from hnclip.evaluation.retrieval import evaluate_model
    from hnclip.runtime.device import compute_device
    from hnclip.runtime.gpu_slots import acquire_slot
    execution, evaluation = reg.profile["execution"], reg.params["evaluation"]
    torch.set_num_threads(execution["threads"])
    dataset = PairDataset.from_manifest(manifest, backbone.preprocess, backbone.tokenizer,
                                        execution.get("cache_images", True), **loading_options(execution))
    with acquire_slot():
        device = compute_device(execution)
        return evaluate_model(backbone.model.to(device), dataset, evaluation["recall_ks"], evaluation["tie_rule"],
                              execution["eval_batch_size"], device)


def _checked_train_record(reg, run_id: str) -> dict:
    record_path, weights = paths.run_record(run_id), paths.run_model(run_id)
    record = read_json(record_path)
    if provenance.file_sha256(weights) != record["outputs"]["model"]["sha256"]:
        raise StaleArtifactError(f"{weights} does not match the sha256 its training record ({record_path}) "
                           f"gives: the checkpoint was replaced; retrain {run_id}")
    recorded = (record.get("params") or {}).get("evaluation")
    if recorded is not None and recorded != reg.params["evaluation"]:
        raise StaleArtifactError(f"{run_id} was evaluated during training with evaluation settings {recorded}, "
                           f"but params.yaml now has {reg.params['evaluation']}: retrain it "
                           f"(`snakemake` reruns it, since these settings are a parameter of its job)")
    return record


def evaluate_run(reg, run_id: str, benchmark: str):
    """Write and return the path of results/evals/<run>/<benchmark>.json (with provenance)."""
    started = time.time()
    manifest = reg.test_manifest(benchmark)
    if not reg.is_zeroshot(run_id):
        reg.run(run_id)  # an unknown run is a user error naming the known ones, not a missing file
    if reg.is_zeroshot(run_id):
        from hnclip.models.factory import backbone_pin, load_backbone
        spec = reg.backbone_spec()
        weights = paths.backbone_weights(reg.backbone_name(), spec["kind"], reg.profile["data_root"])
        backbone = load_backbone(spec["kind"], weights, spec["model_config"], backbone_pin(reg.profile, spec))
        metrics = _encode_and_score(reg, backbone, manifest)
        entry = {"epoch": 0, "metrics": metrics}
        selected = {"best": entry, "last": entry, "initial": metrics, "per_epoch": [entry],
                    "consistent_with_training": None}
        inputs = {"init_weights": weights, "test_manifest": manifest}
        spec_hash = None
        code = {"recall": _encoding_recall()}  # the released weights: no epoch to select
    else:
        record = _checked_train_record(reg, run_id)
        inputs = {"model": paths.run_model(run_id), "test_manifest": manifest, "train_record": paths.run_record(run_id)}
        code = {"selection": provenance.code_name(select_epochs)}
        if any(benchmark in h.get("eval", {}) for h in record["history"]):
            selected = _select(reg, record, benchmark)
            code["recall"] = (record.get("code") or {}).get("recall") or NOT_RECORDED  # computed while training
        else:  # a transfer benchmark: not evaluated every epoch, so the weights are encoded
            inputs["model_selected"] = _checked_selected_model(record, run_id)
            selected = _transfer(reg, record, manifest)
            code["recall"] = _encoding_recall()
        spec_hash = record.get("spec_hash")
    result = {"run_id": run_id, "benchmark": benchmark, **selected}
    result["provenance"] = provenance.record("evaluate", inputs=inputs, spec_hash=spec_hash,
                                             params={"evaluation": reg.params["evaluation"]},
                                             wall_time_s=time.time() - started, extra={"code": code})
    out = paths.evaluation(run_id, benchmark)
    write_json(out, result)
    return out


def _checked_selected_model(record: dict, run_id: str) -> Path:
    """model_selected.pt, checked to be the file its training record names."""
    path, entry = paths.run_selected_model(run_id), record["outputs"].get("model_selected")
    if entry is None:
        raise StaleArtifactError(f"{paths.run_record(run_id)} names no selected checkpoint (model_selected.pt): the "
                                 f"run was trained before transfer cells used one; retrain {run_id}")
    if not path.is_file() or provenance.file_sha256(path) != entry["sha256"]:
        raise StaleArtifactError(f"{path} is missing or does not match the sha256 its training record gives: the "
                                 f"selected checkpoint was replaced; retrain {run_id}")
    return path


def _transfer(reg, record: dict, manifest: Path) -> dict:
    """Best (the checkpoint selected on the run's own training benchmark) and last (the final
    weights) of a trained run on a benchmark it was not evaluated on while training."""
    from hnclip.models.factory import load_weights
    run_id, chosen, final = record["run_id"], record["selected_checkpoint"], record["history"][-1]
    best = {"epoch": chosen["epoch"], "weights_sha256": chosen["weights_sha256"], "checkpoint": "model_selected",
            "selected_on": {"benchmark": chosen["benchmark"], "metric": chosen["metric"]},
            "metrics": _encode_and_score(reg, load_weights(paths.run_selected_model(run_id)), manifest)}
    last = {"epoch": final["epoch"], "weights_sha256": final["weights_sha256"], "checkpoint": "model"}
    if final["weights_sha256"] == best["weights_sha256"]:  # the same weights (training checked both files)
        last["metrics"] = best["metrics"]
    else:
        last["metrics"] = _encode_and_score(reg, load_weights(paths.run_model(run_id)), manifest)
    per_epoch = {entry["epoch"]: {"epoch": entry["epoch"], "metrics": entry["metrics"]} for entry in (best, last)}
    return {"best": best, "last": last, "initial": None, "per_epoch": [per_epoch[e] for e in sorted(per_epoch)],
            "consistent_with_training": None}


def _select(reg, record: dict, benchmark: str) -> dict:
    """Best / last / initial entries of a trained run on one of its in-domain benchmarks."""
    history = record["history"]
    final = history[-1]
    initial = record.get("initial_eval", {}).get(benchmark)
    chosen = select_epochs(history, benchmark, reg.params["evaluation"]["selection_metric"])
    weights = {h["epoch"]: h["weights_sha256"] for h in history}
    return {"best": {**chosen["best"], "weights_sha256": weights[chosen["best"]["epoch"]]},
            "last": {**chosen["last"], "weights_sha256": final["weights_sha256"]},
            "initial": initial, "per_epoch": chosen["per_epoch"],
            # the training job checked that model.pt holds exactly these last-epoch weights
            "consistent_with_training": record.get("saved_weights_match_last_epoch")}
