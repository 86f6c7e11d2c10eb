"""What `hnclip evaluate` writes: results/evals/<run>/<benchmark>.json, best and last epoch.

A trained run is evaluated on its in-domain benchmarks after every epoch while it trains (with
the same `hnclip.evaluation.retrieval` code, on the exported weights of that epoch), and its training job
checks that the saved model.pt holds exactly the last epoch's weights. This job therefore only
selects from the training record, after checking that model.pt is still the file the record
names and that the record was evaluated with today's evaluation settings: no model is loaded.
Encoding happens only where nothing was recorded: the zero-shot pseudo-run (the initial backbone
as released) and transfer benchmarks a run was not evaluated on while training.
"""
from __future__ import annotations

import time

from hnclip import provenance
from hnclip.config import paths
from hnclip.errors import StaleArtifactError
from hnclip.evaluation.selection import select_epochs
from hnclip.io import read_json, write_json


def _encode_and_score(reg, backbone, manifest) -> dict:
    """Recall@K of `backbone` on a test manifest, in fp32 on the profile's device (a GPU slot)."""
    import torch

    from hnclip.data.loader import PairDataset
    from hnclip.evaluation.retrieval import evaluate_model
    from hnclip.runtime.device import resolve_device
    from hnclip.runtime.gpu_slots import acquire_slot
    execution, evaluation = reg.profile["execution"], reg.params["evaluation"]
    torch.set_num_threads(execution["threads"])
    dataset = PairDataset.from_manifest(manifest, backbone.preprocess, backbone.tokenizer)
    with acquire_slot():
        device = resolve_device(execution["device"])
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
        from hnclip.models.factory import load_backbone
        spec = reg.backbone_spec()
        weights = paths.backbone_weights(reg.backbone_name(), spec["kind"], reg.profile["data_root"])
        metrics = _encode_and_score(reg, load_backbone(spec["kind"], weights, spec["model_config"]), manifest)
        entry = {"epoch": 0, "metrics": metrics}
        selected = {"best": entry, "last": entry, "initial": metrics, "per_epoch": [entry],
                    "consistent_with_training": None}
        inputs = {"init_weights": weights, "test_manifest": manifest}
        spec_hash = None
    else:
        record = _checked_train_record(reg, run_id)
        selected = _select(reg, record, benchmark)
        inputs = {"model": paths.run_model(run_id), "test_manifest": manifest, "train_record": paths.run_record(run_id)}
        spec_hash = record.get("spec_hash")
    result = {"run_id": run_id, "benchmark": benchmark, **selected}
    result["provenance"] = provenance.record("evaluate", inputs=inputs, spec_hash=spec_hash,
                                             params={"evaluation": reg.params["evaluation"]},
                                             wall_time_s=time.time() - started)
    out = paths.evaluation(run_id, benchmark)
    write_json(out, result)
    return out


def _select(reg, record: dict, benchmark: str) -> dict:
    """Best / last / initial entries of a trained run on one benchmark."""
    history = record["history"]
    final = history[-1]
    initial = record.get("initial_eval", {}).get(benchmark)
    try:
        chosen = select_epochs(history, benchmark, reg.params["evaluation"]["selection_metric"])
    except KeyError:  # a transfer benchmark: not evaluated every epoch, so the final weights are encoded
        from hnclip.models.factory import load_weights
        metrics = _encode_and_score(reg, load_weights(paths.run_model(record["run_id"])), reg.test_manifest(benchmark))
        last = {"epoch": final["epoch"], "metrics": metrics, "weights_sha256": final["weights_sha256"]}
        return {"last": last, "initial": initial, "best": {**last, "note": "not evaluated every epoch; best = last"},
                "per_epoch": [last], "consistent_with_training": None}
    weights = {h["epoch"]: h["weights_sha256"] for h in history}
    return {"best": {**chosen["best"], "weights_sha256": weights[chosen["best"]["epoch"]]},
            "last": {**chosen["last"], "weights_sha256": final["weights_sha256"]},
            "initial": initial, "per_epoch": chosen["per_epoch"],
            # the training job checked that model.pt holds exactly these last-epoch weights
            "consistent_with_training": record.get("saved_weights_match_last_epoch")}
