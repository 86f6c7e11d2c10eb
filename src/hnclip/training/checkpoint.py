"""The resume checkpoint of a training run: trained weights (or adapters), optimizer, loop
position and RNG state, in .cache/checkpoints/<run>/ (outside Snakemake's outputs, so a failed job
keeps it).

Two files: `last.pt`, the newest, and `previous.pt`, the one before it. A new checkpoint is written to
a temporary `.part` file, synced to disk, read back and checked against the sha256 of the bytes
written; only then does `last.pt` become `previous.pt` and the new file `last.pt`. So at every moment
one complete checkpoint is on disk, and a resume whose `last.pt` does not load (a disk that lost its
last blocks, a file cut short outside this code) falls back to `previous.pt`, saying so on stderr and
in train.json (`training.resume`). A save killed half-way leaves its `.part` file; the next start
removes it (`remove_stale_parts`).

Saving costs the loop only the copy of the state to host memory (`host_copy`): a background thread
(`CheckpointWriter`) writes, checks and renames while the next steps run. One write is in flight at
a time; the loop waits for it before the next copy and before it writes an epoch's selected weights.
"""
from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from hnclip.errors import StaleArtifactError
from hnclip.io import PART_SUFFIX, atomic_path, fsync_path
from hnclip.training.frameworks import TrainedModel
from hnclip.training.state import LoopState

_READ_CHUNK = 16 * 2**20


def checkpoint_path(checkpoint_dir: Path) -> Path:
    return checkpoint_dir / "last.pt"


def previous_checkpoint_path(checkpoint_dir: Path) -> Path:
    return checkpoint_dir / "previous.pt"


def selected_weights_path(checkpoint_dir: Path, epoch: int) -> Path:
    """The exported weights of the epoch selected so far on the run's own benchmark: kept in the
    resume area, so a best epoch reached before an interruption survives it."""
    return checkpoint_dir / f"selected_epoch_{epoch:02d}.pt"


def remove_stale_parts(checkpoint_dir: Path) -> list[Path]:
    """Delete the temporary files of writes that a kill interrupted (a paper-size checkpoint's is
    5.1 GB); call it before this run writes anything. Returns what was deleted."""
    if not checkpoint_dir.is_dir():
        return []
    stale = sorted(checkpoint_dir.glob(f".*{PART_SUFFIX}"))
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def checkpoint_payload(spec_hash: str, trained: TrainedModel, optimizer, state: LoopState) -> dict:
    """What a checkpoint holds. Full runs store the model; adapter runs only the adapters (the frozen
    base is re-loaded). Its tensors are the live ones: `host_copy` it before training goes on."""
    return {"spec_hash": spec_hash, **trained.checkpoint_state(), "optimizer": optimizer.state_dict(),
            "state": state.as_dict(), "rng": torch.get_rng_state()}


def host_copy(obj, reuse: list[torch.Tensor] | None = None):
    """`obj` (dicts, lists, tuples of tensors and plain values) with every tensor copied to host memory,
    so training may change the originals while a thread writes the copy. Accelerator tensors go to pinned
    pages with non-blocking copies (then one synchronization); `reuse`: the buffers of the previous copy,
    taken in order where shape and dtype match (a paper-size state is 5.1 GB: pinning it anew each time
    would cost more than the copy). The buffers used are appended to a fresh list, returned second."""
    used: list[torch.Tensor] = []
    pool = list(reversed(reuse or []))
    devices: set[torch.device] = set()

    def copy(value):
        if isinstance(value, torch.Tensor):
            value = value.detach()
            if value.device.type == "cpu":
                return value.clone()
            devices.add(value.device)
            buffer = pool.pop() if pool else None
            if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
                buffer = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
            buffer.copy_(value, non_blocking=True)
            used.append(buffer)
            return buffer
        if isinstance(value, dict):
            return {key: copy(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(copy(item) for item in value)
        return value

    copied = copy(obj)
    for device in devices:  # the non-blocking copies have landed before the writer reads them
        getattr(torch, device.type).synchronize(device)
    return copied, used


class _HashingWriter:
    """A write-only file object that hashes what passes through it (torch.save writes, then flushes)."""

    def __init__(self, handle):
        self.handle, self.sha256 = handle, hashlib.sha256()

    def write(self, data) -> int:
        self.sha256.update(data)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_checkpoint(checkpoint_dir: Path, payload: dict) -> Path:
    """Write `payload` as the newest checkpoint, keeping the one it replaces as `previous.pt` (see the
    module doc for the order of operations). Raises if the bytes read back differ from those written."""
    last, previous = checkpoint_path(checkpoint_dir), previous_checkpoint_path(checkpoint_dir)
    with atomic_path(last) as tmp:
        with open(tmp, "wb") as handle:
            writer = _HashingWriter(handle)
            torch.save(payload, writer)
        if _file_sha256(tmp) != writer.sha256.hexdigest():
            raise OSError(f"{tmp}: the checkpoint read back differs from what was written; {last} is kept")
        if last.exists():  # the previous checkpoint stays until the new one is complete and checked
            os.replace(last, previous)
            fsync_path(checkpoint_dir)
    return last


def save_checkpoint(checkpoint_dir: Path, spec_hash: str, trained: TrainedModel, optimizer, state: LoopState) -> None:
    """Write a checkpoint now, in this thread (`CheckpointWriter` writes in the background)."""
    write_checkpoint(checkpoint_dir, host_copy(checkpoint_payload(spec_hash, trained, optimizer, state))[0])


@dataclass
class CheckpointWriter:
    """Writes one run's checkpoints in a background thread (`background` False: in the caller's). The
    loop's cost is `copy_s` (host copies) and `wait_s` (waiting for a write still in flight); `write_s`
    is the writer thread's own time, `final_wait_s` the job's wait for its last write after the loop."""
    checkpoint_dir: Path
    background: bool = True
    written: int = 0
    copy_s: float = 0.0
    wait_s: float = 0.0
    write_s: float = 0.0
    final_wait_s: float = 0.0
    _thread: threading.Thread | None = None
    _error: BaseException | None = None
    _buffers: list = field(default_factory=list)

    def save(self, spec_hash: str, trained: TrainedModel, optimizer, state: LoopState,
             after: Callable[[], None] | None = None) -> None:
        """Copy the run's state to host memory and write it; `after` runs once the checkpoint is committed."""
        self.wait()  # one write in flight: its buffers are reused by this copy
        started = time.perf_counter()
        payload, self._buffers = host_copy(checkpoint_payload(spec_hash, trained, optimizer, state), self._buffers)
        self.copy_s += time.perf_counter() - started
        if not self.background:
            self._write(payload, after)
            self.wait()
            return
        self._thread = threading.Thread(target=self._write, args=(payload, after), name="checkpoint-writer")
        self._thread.start()  # not a daemon: an exiting interpreter lets it finish the file

    def _write(self, payload: dict, after: Callable[[], None] | None) -> None:
        started = time.perf_counter()
        try:
            write_checkpoint(self.checkpoint_dir, payload)
            if after is not None:
                after()
            self.written += 1
        except BaseException as error:  # re-raised in the loop's thread by wait()
            self._error = error
        finally:
            self.write_s += time.perf_counter() - started

    def wait(self, final: bool = False) -> None:
        """Block until the write in flight is committed; raise its error if it failed. `final`: the job's
        wait after its loop (counted apart from the loop's)."""
        if self._thread is not None:
            started = time.perf_counter()
            self._thread.join()
            self._thread = None
            if final:
                self.final_wait_s += time.perf_counter() - started
            else:
                self.wait_s += time.perf_counter() - started
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"writing the resume checkpoint in {self.checkpoint_dir} failed: {error}") from error

    def summary(self) -> dict:
        """train.json's `training.checkpoints`: this process's writes and what they cost the loop."""
        return {"written": self.written, "background": self.background, "host_copy_s": round(self.copy_s, 3),
                "wait_s": round(self.wait_s, 3), "write_s": round(self.write_s, 3),
                "final_wait_s": round(self.final_wait_s, 3)}


@dataclass
class Restored:
    """The checkpoint a run resumed from, and the newer ones that failed to load (file: error)."""
    state: dict
    path: Path
    failed: list[str]

    def record(self) -> dict:
        return {"checkpoint": self.path.name, "step": self.state["step"], "failed": self.failed}


def load_checkpoint(checkpoint_dir: Path, spec_hash: str, trained: TrainedModel, optimizer,
                    records: dict | None = None, origin: dict | None = None) -> Restored | None:
    """Restore weights, optimizer and RNG in place from the newest checkpoint that loads (`last.pt`,
    else `previous.pt`, each failure said on stderr); returns it with its loop state (`LoopState.as_dict`),
    or None without a usable checkpoint.

    `records`: the settings that shape the run's records but not its weights (per-epoch evaluation,
    gradient probe, timed costs). A checkpoint written under other ones cannot give the records now
    asked for (a finished run resumed would probe nothing), so it is not resumed: None, and the run
    trains afresh to the same weights (`state["records"]` holds them; older checkpoints lack them).

    `origin`: the content the run starts from (initial weights, training manifest; `state["origin"]`). A
    run id names a downloaded backbone and a real dataset by source, not by content, so a new release
    (Long-CLIP-L re-uploaded, an archive re-released) keeps the id: a checkpoint trained from other
    content is not resumed (None: the run trains afresh from what is there now)."""
    failed: list[str] = []
    for path in (checkpoint_path(checkpoint_dir), previous_checkpoint_path(checkpoint_dir)):
        if not path.exists():
            continue
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # truncated or corrupt: zip, pickle or I/O errors alike
            failed.append(f"{path.name}: {type(error).__name__}: {' '.join(str(error).split())[:200]}")
            print(f"{path}: does not load ({failed[-1]}); trying the checkpoint before it", file=sys.stderr)
            continue
        return _restore(path, payload, spec_hash, trained, optimizer, records, origin, failed)
    if failed:
        print(f"{checkpoint_dir}: no checkpoint loads; training afresh", file=sys.stderr)
    return None


def _restore(path: Path, payload: dict, spec_hash: str, trained: TrainedModel, optimizer, records, origin,
             failed: list[str]) -> Restored | None:
    if payload["spec_hash"] != spec_hash:
        raise StaleArtifactError(f"{path} belongs to a different run spec ({payload['spec_hash'][:8]} != "
                                 f"{spec_hash[:8]}); delete {path.parent} to start this run afresh")
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
    if failed:
        print(f"resuming from {path} (optimizer step {payload['state']['step']}), the newest checkpoint that loads",
              file=sys.stderr)
    return Restored(payload["state"], path, failed)
