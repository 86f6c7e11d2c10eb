"""Fine-tuning loop: micro-batch contrastive steps, gradient accumulation, AdamW + cosine,
evaluation after every epoch, resumable checkpoints, a step log and non-finite-loss guards.

The contrastive softmax runs over one micro-batch (as in the paper: micro-batch 16, 8x
accumulation = effective batch 128). Data order is a pure function of (seed, epoch), and the
resume checkpoint holds model, optimizer, position and RNG state, so a killed run that is
restarted reaches the same weights as an uninterrupted one.
"""
from __future__ import annotations

import copy
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from . import provenance
from .data.loader import PairDataset, subset_indices
from .evaluate import evaluate_model
from .io import atomic_path, sha256_bytes, write_json, write_jsonl
from .losses import hn_loss, infonce_loss, token_alignment_loss
from .models.factory import load_backbone, save_weights
from .models.towers import encode_batch, encode_text

SATURATION_THRESHOLD = 1e-3
TOKEN_LOSS_CHUNK = 16  # captions per chunk of the token-level term: bounds its memory at paper scale


class NonFiniteLossError(RuntimeError):
    pass


@dataclass
class TrainJob:
    run_id: str
    spec: dict            # objective, recipe, seed, fraction: everything that defines the run
    spec_hash: str
    init_kind: str        # pretrained_here | longclip | scratch
    init_path: Path | None
    model_config: str
    train_manifest: Path
    eval_manifests: dict[str, Path]   # benchmark -> test manifest, evaluated after every epoch
    out_dir: Path
    checkpoint_dir: Path
    execution: dict
    evaluation: dict
    stop_after_steps: int | None = None   # test hook: SIGKILL this process after that optimizer step
    extra_inputs: dict = field(default_factory=dict)


# ---- pieces ------------------------------------------------------------------------------------
def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW; no weight decay on gains, biases, embeddings and the logit scale (open_clip's rule)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        exclude = param.ndim < 2 or "bn" in name or "ln" in name or "bias" in name or "logit_scale" in name \
            or "embedding" in name
        (no_decay if exclude else decay).append(param)
    return torch.optim.AdamW([{"params": no_decay, "weight_decay": 0.0},
                              {"params": decay, "weight_decay": weight_decay}], lr=lr)


def cosine_lr(step: int, total_steps: int, base_lr: float, warmup_steps: int) -> float:
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * base_lr * (1 + math.cos(math.pi * min(1.0, progress)))


def epoch_micro_batches(indices: list[int], micro_batch: int, seed: int, epoch: int) -> list[list[int]]:
    """Shuffled micro-batches of one epoch; the incomplete tail is dropped so every softmax has
    the same number of candidates."""
    generator = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = [indices[i] for i in torch.randperm(len(indices), generator=generator).tolist()]
    return [order[i:i + micro_batch] for i in range(0, len(order) - micro_batch + 1, micro_batch)]


def accumulation_groups(micro_batches: list, grad_accum: int) -> list[list]:
    return [micro_batches[i:i + grad_accum] for i in range(0, len(micro_batches), grad_accum)]


def frozen_text_encoder(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of the initial text tower only (Table 3c): the image tower is not copied."""
    visual = model.visual
    model.visual = None
    try:
        frozen = copy.deepcopy(model)
    finally:
        model.visual = visual
    frozen.requires_grad_(False).eval()
    return frozen


def loss_terms(model, images, tokens, objective: dict, frozen_text=None) -> dict[str, torch.Tensor]:
    """The objective's named terms for one micro-batch; `total` is what is back-propagated.
    `infonce` (plain InfoNCE on the same features, no gradient) is always logged: it is the
    saturation diagnostic of paper Fig. 4 even when the trained objective is L_HN."""
    gamma, lambda_tok = objective["gamma"], objective["lambda_tok"]
    enc = encode_batch(model, images, tokens, with_tokens=lambda_tok > 0)
    scale = model.logit_scale.exp()
    terms = {}
    if gamma > 0:
        margin_features = None
        if objective["margin"] == "frozen":
            with torch.no_grad():
                margin_features = encode_text(frozen_text, tokens)
        terms["hn"] = hn_loss(enc.image_features, enc.text_features, scale, gamma, margin_features)
        with torch.no_grad():
            terms["infonce"] = infonce_loss(enc.image_features, enc.text_features, scale)
        total = terms["hn"]
    else:
        terms["infonce"] = infonce_loss(enc.image_features, enc.text_features, scale)
        total = terms["infonce"]
    if lambda_tok > 0:
        terms["tok"] = token_alignment_loss(enc.image_tokens, enc.text_tokens, enc.text_padding_mask, scale,
                                            chunk_size=TOKEN_LOSS_CHUNK)
        total = total + lambda_tok * terms["tok"]
    terms["total"] = total
    return terms


def gradient_norm(model: torch.nn.Module) -> float:
    norms = [p.grad.detach().norm(2) for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over the raw bytes of the state dict, in key order: names the exact epoch weights."""
    import hashlib
    digest = hashlib.sha256()
    for key, tensor in model.state_dict().items():
        digest.update(key.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# ---- checkpoints -------------------------------------------------------------------------------
def _checkpoint_path(job: TrainJob) -> Path:
    return job.checkpoint_dir / "last.pt"


def save_checkpoint(job: TrainJob, model, optimizer, state: dict) -> None:
    payload = {"spec_hash": job.spec_hash, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
               "state": state, "rng": torch.get_rng_state()}
    with atomic_path(_checkpoint_path(job)) as tmp:
        torch.save(payload, tmp)


def load_checkpoint(job: TrainJob, model, optimizer) -> dict | None:
    path = _checkpoint_path(job)
    if not path.exists():
        return None
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if payload["spec_hash"] != job.spec_hash:
        raise RuntimeError(f"{path} belongs to a different run spec ({payload['spec_hash'][:8]} != "
                           f"{job.spec_hash[:8]}); delete {job.checkpoint_dir} to start this run afresh")
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    torch.set_rng_state(payload["rng"])
    return payload["state"]


# ---- the loop ----------------------------------------------------------------------------------
def _resolve_device(requested: str) -> torch.device:
    try:
        from .device import resolve_device
    except ImportError:  # pragma: no cover - device module arrives with the models layer
        return torch.device("cpu" if requested == "auto" else requested)
    return resolve_device(requested)


def _summarise_epoch(records: list[dict]) -> dict:
    summary = {"micro_batches": len(records)}
    for term in ("infonce", "hn", "tok", "total"):
        values = [r[term] for r in records if term in r]
        if values:
            summary[f"{term}_mean"] = sum(values) / len(values)
            summary[f"{term}_saturated_frac"] = sum(v < SATURATION_THRESHOLD for v in values) / len(values)
    return summary


def _evaluate_all(model, eval_sets: dict, job: TrainJob, device) -> dict:
    return {name: evaluate_model(model, data, job.evaluation["recall_ks"], job.evaluation["tie_rule"],
                                 job.execution["eval_batch_size"], device)
            for name, data in eval_sets.items()}


def train(job: TrainJob) -> dict:
    started = time.time()
    spec, execution = job.spec, job.execution
    recipe, objective = spec["recipe"], spec["objective"]
    torch.set_num_threads(execution["threads"])
    torch.manual_seed(spec["seed"])
    device = _resolve_device(execution["device"])

    backbone = load_backbone(job.init_kind, job.init_path, job.model_config)
    model = backbone.model.to(device).train()
    if recipe.get("reset_logit_scale"):
        with torch.no_grad():
            model.logit_scale.fill_(math.log(recipe["reset_logit_scale"]))
    frozen_text = frozen_text_encoder(model) if objective["margin"] == "frozen" else None
    cache = execution.get("cache_images", True)
    train_set = PairDataset.from_manifest(job.train_manifest, backbone.preprocess, backbone.tokenizer, cache)
    indices = subset_indices(len(train_set), spec["fraction"])
    eval_sets = {name: PairDataset.from_manifest(path, backbone.preprocess, backbone.tokenizer, cache)
                 for name, path in job.eval_manifests.items()}

    micro, accum = recipe["micro_batch"], recipe["grad_accum"]
    if len(indices) < micro:
        raise ValueError(f"{job.run_id}: {len(indices)} training pairs is fewer than one micro-batch ({micro})")
    steps_per_epoch = len(accumulation_groups(epoch_micro_batches(indices, micro, spec["seed"], 0), accum))
    total_steps = recipe["epochs"] * steps_per_epoch
    optimizer = build_optimizer(model, recipe["lr"], recipe["weight_decay"])

    state = load_checkpoint(job, model, optimizer) or {"epoch": 0, "group": 0, "step": 0, "history": [],
                                                      "steps": [], "epoch_records": []}
    resumed_from = state["step"] if state["step"] else None
    if "initial_eval" not in state:  # the starting point (zero-shot init), for "does fine-tuning help?"
        state["initial_eval"] = _evaluate_all(model, eval_sets, job, device)
    progress = tqdm(total=total_steps, initial=state["step"], desc=job.run_id, unit="step",
                    mininterval=1 if sys.stderr.isatty() else 15, file=sys.stderr)
    for epoch in range(state["epoch"], recipe["epochs"]):
        groups = accumulation_groups(epoch_micro_batches(indices, micro, spec["seed"], epoch), accum)
        for group_index in range(state["group"], len(groups)):
            lr = cosine_lr(state["step"], total_steps, recipe["lr"], recipe["warmup_steps"])
            for param_group in optimizer.param_groups:
                param_group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            for batch_indices in groups[group_index]:
                images, tokens = train_set.batch(batch_indices)
                terms = loss_terms(model, images.to(device), tokens.to(device), objective, frozen_text)
                values = {name: float(value.detach()) for name, value in terms.items()}
                if not all(math.isfinite(v) for v in values.values()):
                    raise NonFiniteLossError(
                        f"{job.run_id}: non-finite loss at epoch {epoch + 1}, optimizer step {state['step'] + 1} "
                        f"({values}); no update was applied and the last good checkpoint "
                        f"({_checkpoint_path(job)}, step {state['step']}) is kept. Lower the learning rate or "
                        f"check the data, then rerun to resume from it.")
                (terms["total"] / len(groups[group_index])).backward()
                state["epoch_records"].append(values)
            grad_norm = gradient_norm(model)
            optimizer.step()
            state["step"] += 1
            state["group"] = group_index + 1
            last = state["epoch_records"][-len(groups[group_index]):]
            state["steps"].append({"step": state["step"], "epoch": epoch + 1, "lr": lr, "grad_norm": grad_norm,
                                   "logit_scale": float(model.logit_scale.detach().exp()),
                                   **{f"{k}_mean": sum(r[k] for r in last) / len(last) for k in last[0]},
                                   "saturated_frac": sum(r["infonce"] < SATURATION_THRESHOLD for r in last) / len(last)})
            progress.update(1)
            progress.set_postfix(loss=f"{values['total']:.3g}", refresh=False)
            if state["step"] % execution["checkpoint_every_steps"] == 0:
                save_checkpoint(job, model, optimizer, state)
            if job.stop_after_steps and state["step"] >= job.stop_after_steps:
                progress.close()
                os.kill(os.getpid(), signal.SIGKILL)  # simulate a scheduler kill (tests)
        entry = {"epoch": epoch + 1, "step": state["step"], "train": _summarise_epoch(state["epoch_records"]),
                 "eval": _evaluate_all(model, eval_sets, job, device), "weights_sha256": weights_digest(model)}
        if execution.get("keep_epoch_weights"):
            save_weights(model, job.model_config, job.checkpoint_dir / f"epoch_{epoch + 1:02d}.pt")
        state["history"].append(entry)
        state.update(epoch=epoch + 1, group=0, epoch_records=[])
        save_checkpoint(job, model, optimizer, state)
    progress.close()
    return _write_outputs(job, model, state, backbone_info(job), time.time() - started, resumed_from, device)


def backbone_info(job: TrainJob) -> dict:
    return {"kind": job.init_kind, "model_config": job.model_config,
            "path": str(job.init_path) if job.init_path else None}


def _write_outputs(job: TrainJob, model, state: dict, init: dict, wall: float, resumed_from, device) -> dict:
    job.out_dir.mkdir(parents=True, exist_ok=True)
    model_path = job.out_dir / "model.pt"
    save_weights(model, job.model_config, model_path)
    write_jsonl(job.out_dir / "steps.jsonl", state["steps"])
    inputs = {"train_manifest": job.train_manifest, **{f"eval_manifest:{k}": v for k, v in job.eval_manifests.items()},
              **job.extra_inputs}
    if job.init_path:
        inputs["init_weights"] = job.init_path
    record = provenance.record(
        "train", inputs=inputs, spec=job.spec, spec_hash=job.spec_hash, wall_time_s=wall,
        device={"type": str(device), "threads": job.execution["threads"]},
        extra={"run_id": job.run_id, "init": init, "initial_eval": state["initial_eval"],
               "history": state["history"],
               "outputs": {"model": {"path": str(model_path), "sha256": provenance.file_sha256(model_path)}},
               "resumed_from_step": resumed_from, "optimizer_steps": state["step"],
               "final_weights_sha256": state["history"][-1]["weights_sha256"] if state["history"] else None,
               "images_per_second": _throughput(job, state, wall)})
    write_json(job.out_dir / "train.json", record)
    return record


def _throughput(job: TrainJob, state: dict, wall: float) -> float:
    """Training images per second of wall time (including per-epoch evaluation) in this process."""
    micro = job.spec["recipe"]["micro_batch"]
    micro_batches = sum(h["train"]["micro_batches"] for h in state["history"])
    return micro * micro_batches / wall if wall > 0 else 0.0
