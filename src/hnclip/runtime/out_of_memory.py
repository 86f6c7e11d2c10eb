"""Out of memory on any backend, and the one fallback every batched job shares: halve, retry, record.

`is_out_of_memory` knows torch's OutOfMemoryError and the backends that raise a plain RuntimeError
(Ascend NPU); `release_cached_memory` hands a failed attempt's blocks back before the retry. `HalvingBatch`
is the smaller-batch ladder of work whose result does not depend on how it is batched: evaluation's
encoding (hnclip.evaluation.retrieval), the gradient probe's forwards (hnclip.training.probe). The trainer's
own ladder, which also turns on activation checkpointing and is saved with the run (hnclip.training.memory),
and SAM's prompt batches, halved inside a generator (hnclip.auxiliary.sam_masks), use the two functions here.
"""
from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from hnclip.runtime.device import empty_cache

T = TypeVar("T")


def is_out_of_memory(error: BaseException) -> bool:
    """torch's OutOfMemoryError, or a backend's RuntimeError that says "out of memory" (e.g. NPU)."""
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and "out of memory" in str(error).lower())


def release_cached_memory(device: torch.device | str) -> None:
    # The failed step's tensors are garbage once its exception is gone; hand their blocks back (on
    # whichever backend ran it: CUDA, NPU, MPS) so the smaller size is not refused for fragmentation.
    gc.collect()
    empty_cache(device)


@dataclass
class HalvingBatch:
    """Items per call of a batched computation: `requested` at first, halved after each out-of-memory
    error (never below `minimum`), and kept small from then on. `fallbacks` lists each halving;
    `record()` is what an output record says about it (None while nothing was halved, so records of
    runs that never ran out of memory stay as they were)."""
    requested: int
    minimum: int = 1
    what: str = "batch"                       # how logs and records name the size
    size: int = 0
    fallbacks: list[list[int]] = field(default_factory=list)   # [from, to] per halving

    def __post_init__(self):
        if self.requested < 1 or self.minimum < 1:
            raise ValueError(f"{self.what}: sizes must be positive "
                             f"(requested {self.requested}, minimum {self.minimum})")
        self.size = self.size or self.requested

    def halve(self, log: Callable[[str], None] = print) -> bool:
        """The next smaller size, logged and recorded; False when the size is already the minimum."""
        if self.size <= self.minimum:
            return False
        smaller = max(self.minimum, self.size // 2)
        log(f"{self.what}: {self.size} ran out of memory; retrying with {smaller}")
        self.fallbacks.append([self.size, smaller])
        self.size = smaller
        return True

    def run(self, attempt: Callable[[int], T], device: torch.device | str, log: Callable[[str], None] = print,
            retry: bool = True) -> T:
        """attempt(size), retried at the next smaller size after each out-of-memory error. The attempt must
        leave nothing behind that matters when it fails. Other errors, and out of memory at the minimum (or
        with retry False: where one process cannot retry alone), are raised."""
        while True:
            try:
                return attempt(self.size)
            except RuntimeError as error:  # torch.OutOfMemoryError is a RuntimeError
                if not (retry and is_out_of_memory(error) and self.halve(log)):
                    raise
            release_cached_memory(device)  # outside the handler: the failed attempt's tensors are garbage now

    def record(self) -> dict | None:
        if not self.fallbacks:
            return None
        return {"what": self.what, "requested": self.requested, "used": self.size, "halvings": list(self.fallbacks)}
