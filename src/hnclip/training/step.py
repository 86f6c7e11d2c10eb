"""One optimizer step's gradient: the group's backward in the run's batch mode, the non-finite-loss
guard, and what steps.jsonl and each epoch's summary record of the loss terms.

Batch modes: `micro` (default: each micro-batch its own contrastive batch, gradients averaged),
`exact` (one contrastive batch per accumulation group, `hnclip.training.exact_batch`) and `compute`
(several micro-batches per forward, each its own contrastive group, `hnclip.training.compute_batch`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from hnclip.errors import UserError
from hnclip.training.checkpoint import checkpoint_path
from hnclip.training.compute_batch import compute_batch_backward
from hnclip.training.exact_batch import exact_batch_backward
from hnclip.training.methods import Method

SATURATION_THRESHOLD = 1e-3


class NonFiniteLossError(UserError, RuntimeError):
    pass


def group_backward_mode(recipe: dict, execution: dict, method: Method) -> str:
    """micro (default), exact (one contrastive batch per group) or compute (several micro-batches
    per forward, each its own contrastive group; an execution choice, see `compute_batch`)."""
    if recipe.get("exact_batch"):
        if not method.encodes_plain_pairs:
            raise UserError(f"recipe.exact_batch is not available for the {method.framework} framework")
        return "exact"
    if execution.get("compute_batch", recipe["micro_batch"]) > recipe["micro_batch"] and method.encodes_plain_pairs:
        return "compute"
    return "micro"


def require_finite(values: dict, run_id: str, checkpoint_dir, loss_names: Sequence[str], epoch: int,
                   step: int) -> None:
    if not all(math.isfinite(v) for name, v in values.items() if name in loss_names):
        raise NonFiniteLossError(
            f"{run_id}: non-finite loss at epoch {epoch + 1}, optimizer step {step + 1} "
            f"({values}); no update was applied and the last good checkpoint "
            f"({checkpoint_path(checkpoint_dir)}, step {step}) is kept. Lower the learning rate or "
            f"check the data, then rerun to resume from it.")


def group_backward(mode: str, model, method: Method, batches, positions, objective: dict, frozen_text, autocast,
                   check: Callable[[dict], None], compute_batch: int, micro: int,
                   before_forward: Callable[[int], None]) -> list[dict]:
    """Accumulate one accumulation group's gradient into .grad; one record of float loss terms per
    micro-batch (exact mode: one for the group). `before_forward(pairs)` sees every forward's size."""
    shuffle_keys = [(p.epoch, p.micro_batch) for p in positions]  # each group's shuffled-G key
    if mode == "exact":
        before_forward(sum(batch_pairs(batch) for batch in batches))
        record = exact_batch_backward(model, batches, objective, frozen_text, autocast, shuffle_keys[0])
        check(record)  # after backward, but still before the optimizer step: no update is applied
        return [record]
    if mode == "compute":
        return compute_batch_backward(model, batches, objective, frozen_text, autocast, check, compute_batch, micro,
                                      shuffle_keys=shuffle_keys, before_forward=before_forward)
    records = []
    for batch, position in zip(batches, positions, strict=True):
        before_forward(batch_pairs(batch))
        terms = method.terms(model, batch, position, autocast)
        values = {name: float(value.detach()) for name, value in terms.items()}
        check(values)
        (terms["total"] / len(batches)).backward()
        records.append(values)
    return records


def batch_pairs(batch) -> int:
    """Image-caption pairs in a micro-batch: (images, tokens), or a baseline's batch with .images."""
    return int((batch[0] if isinstance(batch, tuple) else batch.images).shape[0])


def gradient_norm(model: torch.nn.Module) -> float:
    norms = [p.grad.detach().norm(2) for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


def step_record(step: int, epoch: int, lr: float, grad_norm: float, model, records: list[dict],
                batch_mode: str, contrastive_batch: int, loss_names: Sequence[str]) -> dict:
    return {"step": step, "epoch": epoch + 1, "lr": lr, "grad_norm": grad_norm,
            "logit_scale": float(model.logit_scale.detach().exp()),
            **{f"{k}_mean": sum(r[k] for r in records) / len(records) for k in records[0] if k in loss_names},
            "saturated_frac": sum(r["infonce"] < SATURATION_THRESHOLD for r in records) / len(records),
            # L_HN at or above the threshold still has a gradient while InfoNCE saturates (the regime report)
            **({"hn_unsaturated_frac": sum(r["hn"] >= SATURATION_THRESHOLD for r in records) / len(records)}
               if all("hn" in r for r in records) else {}),
            "micro_batches": sum(r.get("micro_batches", 1) for r in records),  # an exact-batch record is a group
            "batch_mode": batch_mode, "contrastive_batch": contrastive_batch}


def summarise_epoch(records: list[dict], loss_names: Sequence[str]) -> dict:
    # exact_batch records stand for a whole group of micro-batches
    summary = {"micro_batches": sum(r.get("micro_batches", 1) for r in records)}
    for term in loss_names:
        values = [r[term] for r in records if term in r]
        if values:
            summary[f"{term}_mean"] = sum(values) / len(values)
            summary[f"{term}_saturated_frac"] = sum(v < SATURATION_THRESHOLD for v in values) / len(values)
    return summary
