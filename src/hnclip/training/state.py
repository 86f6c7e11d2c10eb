"""The training loop's state: where it is, what it has recorded, and what the resume checkpoint
stores of it (a plain dict of built-in types, so the checkpoint loads with `weights_only=True`)."""
from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field, fields


def _timers() -> dict:
    return {"eval_s": 0.0, "probe_s": 0.0, "train_s": 0.0}


@dataclass
class LoopState:
    epoch: int = 0                 # epochs finished
    group: int = 0                 # accumulation groups finished in the current epoch
    step: int = 0                  # optimizer steps finished
    history: list[dict] = field(default_factory=list)        # one entry per finished epoch (evaluation, weights)
    steps: list[dict] = field(default_factory=list)          # steps.jsonl: one record per optimizer step
    epoch_records: list[dict] = field(default_factory=list)  # loss terms of the current epoch's micro-batches
    grad_probe: list[dict] = field(default_factory=list)     # grad_probe.jsonl
    timers: dict = field(default_factory=_timers)             # seconds spent evaluating, probing, stepping
    records: dict | None = None    # the record settings the run was trained under (`outputs.record_settings`)
    origin: dict | None = None     # the content it started from (`outputs.run_origin`)
    initial_eval: dict | None = None   # the evaluation of the initial weights
    memory: dict | None = None     # the memory plan that worked (`training.memory.MemoryPlan.as_dict`)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, saved: dict) -> "LoopState":
        """A checkpoint's state; one written before the memory plan existed stored only its compute batch."""
        known = {f.name for f in fields(cls)}
        state = cls(**{key: value for key, value in saved.items() if key in known})
        if state.memory is None and "compute_batch_used" in saved:
            state.memory = {"compute_batch": saved["compute_batch_used"], "activation_checkpointing": False,
                            "fallbacks": []}
        return state


@contextlib.contextmanager
def timed(timers: dict, key: str):
    """Add the block's wall time to timers[key] (the state's eval_s, probe_s, train_s)."""
    started = time.time()
    try:
        yield
    finally:
        timers[key] += time.time() - started
