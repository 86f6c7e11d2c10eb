"""The weights of the epoch selected on the run's own benchmark (its transfer cells use them):
kept in the resume area while the run trains, copied to model_selected.pt when it ends. One concept at two
layers: this is the training side; the selection rule itself is `hnclip.evaluation.selection`."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from hnclip import provenance
from hnclip.errors import StaleArtifactError
from hnclip.evaluation.selection import select_epochs
from hnclip.hashing import state_dict_digest
from hnclip.io import atomic_path
from hnclip.training.checkpoint import selected_weights_path


def epoch_weights_path(checkpoint_dir: Path, epoch: int) -> Path:
    """An epoch's exported weights, kept in the resume area when execution.keep_epoch_weights is set."""
    return checkpoint_dir / f"epoch_{epoch:02d}.pt"


def selected_epoch(job, history: list[dict]) -> int | None:
    """The epoch `select_epochs` picks on the job's selection benchmark (None: no epoch, or none kept)."""
    if job.selection_benchmark is None or not history:
        return None
    return select_epochs(history, job.selection_benchmark, job.evaluation["selection_metric"])["best"]["epoch"]


def selected_weights_file(job, history: list[dict]) -> Path | None:
    """Where the resume area holds the selected epoch's weights: its own file, or the epoch's kept
    weights (keep_epoch_weights). Raises if neither is there: they cannot be recomputed."""
    epoch = selected_epoch(job, history)
    if epoch is None:
        return None
    candidates = [selected_weights_path(job.checkpoint_dir, epoch), epoch_weights_path(job.checkpoint_dir, epoch)]
    found = next((path for path in candidates if path.is_file()), None)
    if found is None:
        raise StaleArtifactError(f"{job.run_id}: the weights of epoch {epoch}, selected on {job.selection_benchmark}, "
                                 f"are not in {job.checkpoint_dir} (a resume checkpoint written before selected "
                                 f"checkpoints were kept?); delete {job.checkpoint_dir} to retrain this run")
    return found


def prune_selected(job, history: list[dict]) -> None:
    """After a resume checkpoint committed `history`: drop the weights of epochs no longer selected."""
    if job.selection_benchmark is None:
        return
    keep = selected_weights_path(job.checkpoint_dir, selected_epoch(job, history) or 0)
    for path in job.checkpoint_dir.glob("selected_epoch_*.pt"):
        if path != keep:
            path.unlink()


def require_weights(path: Path, weights_sha256: str, evaluated: str) -> None:
    saved = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    if state_dict_digest(saved) != weights_sha256:
        raise RuntimeError(f"{path}: the saved weights differ from those evaluated at {evaluated} "
                           f"(sha256 {weights_sha256}); the file was not written intact")


def write_selected(job, history: list[dict]) -> dict | None:
    """Copy the selected epoch's weights from the resume area to model_selected.pt, checked against
    the weights that epoch's metrics were computed on; returns what train.json records of it."""
    source = selected_weights_file(job, history)
    if source is None:
        return None
    epoch = selected_epoch(job, history)
    weights_sha256 = next(h["weights_sha256"] for h in history if h["epoch"] == epoch)
    target = job.out_dir / "model_selected.pt"
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)
        require_weights(tmp, weights_sha256, f"epoch {epoch}")  # only an intact copy is renamed into place
    return {"benchmark": job.selection_benchmark, "metric": job.evaluation["selection_metric"], "epoch": epoch,
            "weights_sha256": weights_sha256,
            "output": {"path": str(target), "sha256": provenance.file_sha256(target)}}
