"""The plans a training step falls back to when it runs out of memory (`MemoryPlan`): halve the compute
batch down to the micro-batch, then turn on activation checkpointing. Without torch, so that `hnclip plan`
(read by the Snakefile) walks the same ladder the trainer does (hnclip.plan.accelerator_memory); the runtime
around it is hnclip.training.memory."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field


def micro_batches_per_forward(compute_batch: int, micro_batch: int) -> int:
    """How many micro-batches one forward encodes; compute_batch must be a positive multiple of micro_batch."""
    if micro_batch < 1 or compute_batch < micro_batch or compute_batch % micro_batch:
        raise ValueError(f"compute_batch ({compute_batch}) must be a positive multiple of micro_batch ({micro_batch})")
    return compute_batch // micro_batch


@dataclass
class MemoryPlan:
    compute_batch: int                   # pairs per forward (a multiple of the micro-batch)
    micro_batch: int
    activation_checkpointing: bool = False
    can_checkpoint: bool = True          # whether activation checkpointing is a fallback here
    fallbacks: list[dict] = field(default_factory=list)   # each smaller plan chosen: when and why

    def __post_init__(self):
        micro_batches_per_forward(self.compute_batch, self.micro_batch)

    def shrink(self, step: int | None, log: Callable[[str], None]) -> bool:
        """Move to the next smaller plan and record it; False when there is none."""
        if self.compute_batch > self.micro_batch:
            smaller = max(self.micro_batch, self.compute_batch // 2 // self.micro_batch * self.micro_batch)
            log(f"compute_batch: {self.compute_batch} pairs per forward ran out of memory; trying {smaller}")
            self.fallbacks.append({"step": step, "compute_batch": [self.compute_batch, smaller]})
            self.compute_batch = smaller
            return True
        if self.can_checkpoint and not self.activation_checkpointing:
            log(f"out of memory at {self.micro_batch} pairs per forward; retrying with activation checkpointing")
            self.fallbacks.append({"step": step, "activation_checkpointing": [False, True]})
            self.activation_checkpointing = True
            return True
        return False

    def as_dict(self) -> dict:
        return asdict(self)

    def resumed_from(self, saved: dict | None) -> "MemoryPlan":
        """This plan, made no larger than a saved one of the same run (checkpoint or memory.json)."""
        if not saved:
            return self
        return MemoryPlan(min(self.compute_batch, saved["compute_batch"]), self.micro_batch,
                          self.activation_checkpointing or saved["activation_checkpointing"], self.can_checkpoint,
                          list(saved.get("fallbacks", [])))
