"""What a finished run leaves: model.pt, model_selected.pt, steps.jsonl, grad_probe.jsonl and
train.json (its provenance record, with the code of its numbers: `code`), then its resume area is cleared
(retention). Also the settings and origin a resume checkpoint must share with the run (`record_settings`,
`run_origin`)."""
from __future__ import annotations

import shutil
from pathlib import Path

from hnclip import provenance
from hnclip.hashing import file_sha256
from hnclip.io import write_json, write_jsonl
from hnclip.models.factory import save_weights
from hnclip.training.probe import probe_summary
from hnclip.training.schedule import param_group_summary
from hnclip.training.selection import require_weights, write_selected
from hnclip.training.state import LoopState


def record_settings(job) -> dict:
    """What the run's records depend on beyond its spec (the train rule's other params): a resume
    checkpoint is used only under the same ones."""
    execution = job.execution
    probe_every = int(execution.get("grad_probe_every", 0) or 0)
    return {"evaluation": job.evaluation, "eval_manifests": sorted(job.eval_manifests),
            "grad_probe_every": probe_every,
            "grad_probe_precision": execution.get("grad_probe_precision", "fp32"),
            "grad_probe_bf16_every": int(execution.get("grad_probe_bf16_every", 1)) if probe_every else None,
            "cost_only_settings": execution.get("cost_only_settings")}


def run_origin(job) -> dict:
    """The content a run starts from: sha256 of its initial weights (a download's from its verified marker)
    and of its training manifest. A resume checkpoint is used only from the same (see load_checkpoint)."""
    from hnclip.data.verified_files import recorded_sha256
    return {"init_weights": recorded_sha256(job.init_path) if job.init_path else None,
            "train_manifest": file_sha256(job.train_manifest)}



def backbone_info(job) -> dict:
    return {"kind": job.init_kind, "model_config": job.model_config,
            "path": str(job.init_path) if job.init_path else None}


def write_outputs(job, model, state: LoopState, wall: float, resumed_from, device, training: dict,
                  code: dict | None = None) -> dict:
    """Write the run's outputs and train.json; `code`: the code of its numbers (`loop.run_code`)."""
    job.out_dir.mkdir(parents=True, exist_ok=True)
    model_path = job.out_dir / "model.pt"
    save_weights(model, job.model_config, model_path)
    saved_matches = saved_weights_match(model_path, state.history)
    outputs = {"model": {"path": str(model_path), "sha256": provenance.file_sha256(model_path)}}
    selected = write_selected(job, state.history)
    if selected is not None:
        outputs["model_selected"] = selected.pop("output")
    write_jsonl(job.out_dir / "steps.jsonl", state.steps)
    if training["grad_probe"] is not None:
        write_jsonl(job.out_dir / "grad_probe.jsonl", state.grad_probe)
    inputs = {"train_manifest": job.train_manifest, **{f"eval_manifest:{k}": v for k, v in job.eval_manifests.items()},
              **job.extra_inputs}
    if job.init_path:
        inputs["init_weights"] = job.init_path
    if job.execution.get("image_cache"):  # the pixels it read: each cache's record (with its array's sha256)
        from hnclip.data.image_cache import record_path
        inputs.update({f"image_cache:{name}": record_path(manifest) for name, manifest in
                       [("train", job.train_manifest), *job.eval_manifests.items()]})
    record = provenance.record(
        "train", inputs=inputs, spec=job.spec, spec_hash=job.spec_hash, wall_time_s=wall,
        params={"evaluation": job.evaluation, "grad_probe_every": job.execution.get("grad_probe_every", 0)},
        device={"type": str(device), "threads": job.execution["threads"], "processes": training["processes"]},
        extra={"run_id": job.run_id, "code": code, "init": backbone_info(job), "initial_eval": state.initial_eval,
               "history": state.history, "training": training,
               "outputs": outputs, "selected_checkpoint": selected,
               "resumed_from_step": resumed_from, "optimizer_steps": state.step,
               "final_weights_sha256": state.history[-1]["weights_sha256"] if state.history else None,
               "saved_weights_match_last_epoch": saved_matches,
               **throughput(job, state, wall, training["timing_s"])})
    write_json(job.out_dir / "train.json", record)
    return record


def training_summary(run, state: LoopState, plan) -> dict:
    """How the run trained (`loop._Run`, its memory plan), for train.json's `training`."""
    execution, recipe = run.job.execution, run.recipe
    return {"framework": run.trained.framework, "batch_mode": run.mode, "compute_batch": plan.compute_batch,
            "activation_checkpointing": plan.activation_checkpointing, "memory_fallbacks": plan.fallbacks,
            "precision": {"requested": recipe.get("precision", "fp32"), "effective": run.precision},
            "tf32": run.tf32,
            "processes": run.distributed.world_size, "grad_probe": probe_summary(run.probe, state.grad_probe),
            "grad_probe_precision": execution.get("grad_probe_precision", "fp32") if run.probe else None,
            "timing_s": dict(state.timers), "method": run.method.summary,
            "released_costs": execution.get("cost_only_settings", {}),
            "param_groups": param_group_summary(run.optimizer),
            # the checkpoint resumed from, and any newer one that failed to load (None: trained from the start)
            "resume": run.resume,
            # images decoded from files by this job (its loader workers included): with the image cache
            # none; without, each image once while the decoded-image cache holds the split
            "images_decoded": {"train": run.train_set.decodes,
                               "eval": {name: data.decodes for name, data in run.eval_sets.items()}},
            "image_cache": run.train_set.pixels is not None,
            # who loaded the micro-batches (execution.loader_workers): the training thread, worker threads
            # (loads that only read the image cache) or worker processes (loads that decode)
            "loader": {"workers": execution.get("loader_workers", 0),
                       "kind": None if run.feed is None else run.feed.feed.kind},
            "checkpoints": run.checkpoints.summary() if run.checkpoints is not None else None}


def clear_resume_area(job) -> list[Path]:
    """Retention, once train.json is written: the resume checkpoint, the selected epoch's copy (now
    model_selected.pt) and the memory plan are deleted, unless execution.keep_resume_checkpoints; an
    epoch's own weights stay when execution.keep_epoch_weights asked for them. Returns what was deleted.
    A killed run never gets here, so it keeps its resume state."""
    if job.execution.get("keep_resume_checkpoints", False) or not job.checkpoint_dir.is_dir():
        return []
    kept = {path for path in job.checkpoint_dir.glob("epoch_*.pt")} if job.execution.get("keep_epoch_weights") \
        else set()
    deleted = [path for path in sorted(job.checkpoint_dir.iterdir()) if path not in kept]
    for path in deleted:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    if not kept:
        job.checkpoint_dir.rmdir()
    return deleted


def saved_weights_match(model_path: Path, history: list[dict]) -> bool | None:
    """Reread model.pt and check it holds exactly the weights evaluated at the last epoch, so its
    evaluation records can be taken from the per-epoch metrics without re-encoding."""
    if not history:
        return None
    require_weights(model_path, history[-1]["weights_sha256"], "the last epoch")
    return True


def throughput(job, state: LoopState, wall: float, timing: dict) -> dict:
    """Training images per second: over the whole job (per-epoch evaluation included), and over
    the optimizer steps alone, without evaluation and gradient-probe time (what Table A3 reports)."""
    images = job.spec["recipe"]["micro_batch"] * sum(h["train"]["micro_batches"] for h in state.history)
    training_s = timing["train_s"] - timing["probe_s"]
    return {"images_per_second": images / wall if wall > 0 else 0.0,
            "training_time_s": training_s,
            "training_images_per_second": images / training_s if training_s > 0 else 0.0}
