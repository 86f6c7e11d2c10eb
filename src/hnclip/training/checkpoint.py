"""The resume checkpoint of a training run: trained weights (or adapters), optimizer, loop
position and RNG state, written atomically to .cache/checkpoints/<run>/last.pt (outside
Snakemake's outputs, so a failed job keeps it)."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from hnclip.errors import StaleArtifactError
from hnclip.io import atomic_path
from hnclip.training.frameworks import TrainedModel
from hnclip.training.state import LoopState


def checkpoint_path(checkpoint_dir: Path) -> Path:
    return checkpoint_dir / "last.pt"


def selected_weights_path(checkpoint_dir: Path, epoch: int) -> Path:
    """The exported weights of the epoch selected so far on the run's own benchmark: kept in the
    resume area, so a best epoch reached before an interruption survives it."""
    return checkpoint_dir / f"selected_epoch_{epoch:02d}.pt"


def save_checkpoint(checkpoint_dir: Path, spec_hash: str, trained: TrainedModel, optimizer, state: LoopState) -> None:
    """Full runs store the model; adapter runs only the adapters (the frozen base is re-loaded)."""
    payload = {"spec_hash": spec_hash, **trained.checkpoint_state(), "optimizer": optimizer.state_dict(),
               "state": state.as_dict(), "rng": torch.get_rng_state()}
    with atomic_path(checkpoint_path(checkpoint_dir)) as tmp:
        torch.save(payload, tmp)


def load_checkpoint(checkpoint_dir: Path, spec_hash: str, trained: TrainedModel, optimizer,
                    records: dict | None = None, origin: dict | None = None) -> dict | None:
    """Restore weights, optimizer and RNG in place; returns the loop state (`LoopState.as_dict`), or None
    without a checkpoint.

    `records`: the settings that shape the run's records but not its weights (per-epoch evaluation,
    gradient probe, timed costs). A checkpoint written under other ones cannot give the records now
    asked for (a finished run resumed would probe nothing), so it is not resumed: None, and the run
    trains afresh to the same weights (`state["records"]` holds them; older checkpoints lack them).

    `origin`: the content the run starts from (initial weights, training manifest; `state["origin"]`). A
    run id names a downloaded backbone and a real dataset by source, not by content, so a new release
    (Long-CLIP-L re-uploaded, an archive re-released) keeps the id: a checkpoint trained from other
    content is not resumed (None: the run trains afresh from what is there now)."""
    path = checkpoint_path(checkpoint_dir)
    if not path.exists():
        return None
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if payload["spec_hash"] != spec_hash:
        raise StaleArtifactError(f"{path} belongs to a different run spec ({payload['spec_hash'][:8]} != "
                                 f"{spec_hash[:8]}); delete {checkpoint_dir} to start this run afresh")
    if origin is not None and payload["state"].get("origin") != origin:
        print(f"{path}: trained from other initial weights or training data than are there now; training "
              f"afresh", file=sys.stderr)
        return None
    if records is not None and payload["state"].get("records") != records:
        print(f"{path}: written with other record settings (evaluation, gradient probe or timed costs) than "
              f"this run asks for; training afresh (same spec, so the same weights)", file=sys.stderr)
        return None
    trained.restore(payload, path)
    optimizer.load_state_dict(payload["optimizer"])
    torch.set_rng_state(payload["rng"])
    return payload["state"]
