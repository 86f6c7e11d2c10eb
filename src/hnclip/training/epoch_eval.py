"""Evaluation inside a training job: the initial weights once (shared between runs that start from
them), and the exported weights after every epoch, whose R@1 the tables report."""
from __future__ import annotations

from hnclip.evaluation.retrieval import evaluate_model
from hnclip.hashing import file_sha256, json_sha256, weights_digest
from hnclip.io import read_json, write_json
from hnclip.models.factory import save_weights
from hnclip.training.checkpoint import selected_weights_path
from hnclip.training.selection import epoch_weights_path, selected_epoch
from hnclip.training.state import LoopState
from hnclip.training.step import summarise_epoch


def evaluate_all(model, eval_sets: dict, job, device) -> dict:
    image_features: dict = {}  # DCI and Long-DCI share their test images: encoded once per set of weights
    return {name: evaluate_model(model, data, job.evaluation["recall_ks"], job.evaluation["tie_rule"],
                                 job.execution["eval_batch_size"], device, image_features=image_features)
            for name, data in eval_sets.items()}


def initial_evaluation(model, eval_sets: dict, job, device) -> dict:
    """`evaluate_all` of the weights a run starts from. Every run from the same initial weights has
    the same one, so it is computed once and read back by the others (keyed by the weights' and
    test manifests' sha256, the evaluation settings and the device type)."""
    if job.eval_cache_dir is None:
        return evaluate_all(model, eval_sets, job, device)
    key = json_sha256({"weights": weights_digest(model), "device": device.type, "evaluation": job.evaluation,
                       "manifests": {name: file_sha256(path) for name, path in job.eval_manifests.items()}})
    cached = job.eval_cache_dir / f"{key}.json"
    if cached.exists():
        return read_json(cached)
    result = evaluate_all(model, eval_sets, job, device)
    write_json(cached, result)
    return result


def end_of_epoch(job, trained, state: LoopState, epoch: int, eval_sets: dict, device, loss_names) -> dict:
    """Evaluate and fingerprint the exported (for adapters: merged) weights of this epoch."""
    exported = trained.export()
    if job.execution.get("keep_epoch_weights"):
        save_weights(exported, job.model_config, epoch_weights_path(job.checkpoint_dir, epoch + 1))
    evaluated = job.evaluate_epochs == "every" or epoch + 1 == job.spec["recipe"]["epochs"]
    entry = {"epoch": epoch + 1, "step": state.step, "train": summarise_epoch(state.epoch_records, loss_names),
             "eval": evaluate_all(exported, eval_sets, job, device) if evaluated else {},
             "weights_sha256": weights_digest(exported)}
    if selected_epoch(job, state.history + [entry]) == entry["epoch"]:
        # A new best: written before the resume checkpoint that commits this epoch, and the previous
        # best's file is removed only after that commit (prune_selected), so a kill never loses both.
        save_weights(exported, job.model_config, selected_weights_path(job.checkpoint_dir, entry["epoch"]))
    return entry
