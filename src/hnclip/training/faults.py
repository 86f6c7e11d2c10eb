"""Fault injection for tests: what a scheduler kill or an out-of-memory error does to a run.

Read from the environment variable HNCLIP_FAULTS (JSON), so a test can inject a fault into a job
it runs in another process; without it nothing is injected. Keys:
  kill_after_step    SIGKILL this process after that optimizer step (1-based), as a scheduler would
  oom                {"step": s, "max_pairs": n, "needs_checkpointing": bool}: at optimizer step s
                     (0-based; null: every step) a forward raises torch.OutOfMemoryError when it encodes
                     more than n pairs, or, with needs_checkpointing, while activation checkpointing is off
  kill_after_fallback  SIGKILL right after a memory fallback was recorded (before the step ends)
"""
from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass

import torch

from hnclip.errors import UserError

FAULTS_ENV = "HNCLIP_FAULTS"


@dataclass(frozen=True)
class Faults:
    kill_after_step: int | None = None
    oom: dict | None = None
    kill_after_fallback: bool = False

    @classmethod
    def from_env(cls) -> "Faults":
        text = os.environ.get(FAULTS_ENV)
        if not text:
            return cls()
        settings = json.loads(text)
        unknown = set(settings) - {"kill_after_step", "oom", "kill_after_fallback"}
        if unknown:
            raise UserError(f"{FAULTS_ENV}: unknown keys {sorted(unknown)}")
        return cls(**settings)

    def before_forward(self, step: int, pairs: int, checkpointing: bool) -> None:
        """Raise the injected out-of-memory error if this forward is one it applies to."""
        if self.oom is None or self.oom.get("step") not in (None, step):
            return
        too_large = pairs > self.oom.get("max_pairs", pairs)
        if too_large or (self.oom.get("needs_checkpointing") and not checkpointing):
            raise torch.OutOfMemoryError(f"out of memory (injected by {FAULTS_ENV} at step {step}, "
                                         f"{pairs} pairs, activation checkpointing {checkpointing})")

    def after_step(self, step: int) -> None:
        if self.kill_after_step is not None and step >= self.kill_after_step:
            os.kill(os.getpid(), signal.SIGKILL)

    def after_fallback(self) -> None:
        if self.kill_after_fallback:
            os.kill(os.getpid(), signal.SIGKILL)
