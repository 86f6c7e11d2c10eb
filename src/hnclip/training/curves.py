"""Live training curves in TensorBoard's format (what open_clip's trainer writes), one event-file
directory per run under logs/<profile>/<run>/, so `tensorboard --logdir logs/<profile>` shows every run of
a matrix side by side while it trains: each loss term, lr, logit scale, gradient norm, images/s and peak
device memory per optimizer step, and R@1 of every evaluated benchmark after each epoch."""
from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

STEP_FIELDS = ("lr", "logit_scale", "grad_norm")   # steps.jsonl fields drawn as they are


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: the accelerator's allocator peak, or the process's peak RSS on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if device.type == "npu":
        return torch.npu.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


class TrainingCurves:
    """A run's SummaryWriter; `None` directory: nothing is written (other ranks, tests)."""

    def __init__(self, log_dir: Path | None, resume_step: int = 0):  # resume_step: optimizer steps done
        self.writer = None
        if log_dir is not None:
            from torch.utils.tensorboard import SummaryWriter  # tensorboard: imported by the jobs that train
            # purge_step: a run resumed after step k logs k + 1 next; what an interrupted attempt logged from
            # there on (past its checkpoint) is dropped, so each step keeps one value
            self.writer = SummaryWriter(str(log_dir), purge_step=resume_step + 1 if resume_step else None)

    def step(self, record: dict, images: int, seconds: float, device: torch.device) -> None:
        """One optimizer step: its steps.jsonl record, the images it trained on and its wall time."""
        if self.writer is None:
            return
        step = record["step"]
        for name, value in record.items():
            if name.endswith("_mean"):
                self.writer.add_scalar(f"loss/{name[:-len('_mean')]}", value, step)
        for name in STEP_FIELDS:
            self.writer.add_scalar(f"train/{name}", record[name], step)
        self.writer.add_scalar("train/images_per_second", images / seconds if seconds > 0 else 0.0, step)
        self.writer.add_scalar("train/peak_memory_mb", peak_memory_mb(device), step)

    def epoch(self, entry: dict) -> None:
        """R@1 of each benchmark evaluated after an epoch (`loop.end_of_epoch`'s entry)."""
        if self.writer is None:
            return
        for benchmark, metrics in entry["eval"].items():
            for direction in ("t2i", "i2t"):
                self.writer.add_scalar(f"eval/{benchmark}/{direction}_R@1", metrics[direction]["R@1"], entry["step"])
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
