"""Out-of-memory fallbacks that keep each framework's loss exactly as defined on its micro-batch.

A step that runs out of memory is retried on the same accumulation group with a smaller plan:
first the compute batch is halved (pairs per forward; never below the micro-batch, so every
contrastive group keeps its micro-batch of candidates), then activation checkpointing of both towers
is turned on (the blocks' activations are recomputed in the backward: the same arithmetic, less
memory). The smaller plan is kept from then on, stored in the resume checkpoint and, the moment it
is chosen, in `memory.json` beside it, so a run killed right after the error resumes without trying
the failing size again. Out of memory with the smallest plan is an error that says what to change.

What counts as out of memory, and handing a failed attempt's memory back, are shared with the
halve-and-retry ladder of evaluation, the gradient probe and SAM's prompt batches (hnclip.runtime.out_of_memory).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from hnclip.errors import UserError
from hnclip.io import read_json, write_json
from hnclip.runtime.out_of_memory import is_out_of_memory, release_cached_memory  # noqa: F401 (the trainer's names)
from hnclip.training.memory_plan import MemoryPlan, micro_batches_per_forward  # noqa: F401 (the trainer's names)

T = TypeVar("T")


class MemoryExhaustedError(UserError, RuntimeError):
    pass


def run_within_memory(attempt: Callable[[MemoryPlan], T], plan: MemoryPlan, device, log: Callable[[str], None],
                      step: int | None = None, on_fallback: Callable[[MemoryPlan], None] = lambda plan: None,
                      exhausted: str | None = None) -> T:
    """attempt(plan), retried with the next smaller plan after each out-of-memory error. The attempt must
    leave nothing behind that matters when it fails (e.g. its partial gradients are zeroed by the next
    attempt). Other errors are raised at once; out of memory with no smaller plan raises the error itself,
    or MemoryExhaustedError(exhausted) when that message is given."""
    while True:
        try:
            return attempt(plan)
        except RuntimeError as error:  # torch.OutOfMemoryError is a RuntimeError
            if not is_out_of_memory(error):
                raise
            if not plan.shrink(step, log):
                if exhausted is None:
                    raise
                raise MemoryExhaustedError(f"{exhausted} ({error})") from error
        release_cached_memory(device)  # outside the handler: the failed step's tensors are garbage now
        on_fallback(plan)


def fit_compute_batch(try_step: Callable[[int], None], requested: int, micro_batch: int,
                      log: Callable[[str], None], device: torch.device | str = "cpu") -> int:
    """The largest compute batch up to `requested` (halving) at which try_step(size) runs; the value used
    is logged. Out of memory at micro_batch itself is raised."""
    plan = MemoryPlan(requested, micro_batch, can_checkpoint=False)
    run_within_memory(lambda p: try_step(p.compute_batch), plan, device, log)
    log(f"compute_batch: using {plan.compute_batch} pairs per forward (requested {requested}, "
        f"micro_batch {micro_batch})")
    return plan.compute_batch


def memory_lesson_path(checkpoint_dir: Path) -> Path:
    return checkpoint_dir / "memory.json"


def read_memory_lesson(checkpoint_dir: Path) -> dict | None:
    path = memory_lesson_path(checkpoint_dir)
    return read_json(path) if path.is_file() else None


def write_memory_lesson(checkpoint_dir: Path, plan: MemoryPlan) -> None:
    write_json(memory_lesson_path(checkpoint_dir), plan.as_dict())


def set_activation_checkpointing(module: torch.nn.Module, enabled: bool) -> None:
    """Turn activation checkpointing of every open_clip transformer (both towers; through LoRA/DoRA
    wrappers too) on or off: each residual block's activations are recomputed in the backward."""
    found = False
    for sub in module.modules():
        if hasattr(sub, "resblocks") and hasattr(sub, "grad_checkpointing"):
            sub.grad_checkpointing = enabled
            found = True
    if not found:
        raise ValueError(f"{type(module).__name__} has no open_clip transformer to checkpoint")
