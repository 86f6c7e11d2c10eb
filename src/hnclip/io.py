"""Atomic file writes and JSON (lines) reading/writing: every artifact is written whole or not at all."""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

PART_SUFFIX = ".part"   # atomic_path's temporary files: `.<name>.<random>.part` beside the target


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling path; rename it onto `path` only if the block succeeds.

    Durable as well as atomic: the file's data is synced to disk before the rename, and the directory
    after it, so a crash (power loss, node failure) leaves either the old file or the complete new one,
    never a name pointing at unwritten blocks (ext4/xfs may otherwise persist the rename first)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=PART_SUFFIX, dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        fsync_path(tmp_path)
        os.replace(tmp_path, target)
        fsync_path(target.parent)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def fsync_path(path: str | os.PathLike) -> None:
    """Flush to disk a file's data, or a directory's entries (a rename, a new or removed name)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_jsonl(path: str | os.PathLike, rows: list[dict]) -> None:
    write_text(path, "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def package_text(package: str, name: str) -> str:
    """A data file shipped inside one of our packages (e.g. `hnclip.claims`, `claims.yaml`): from the
    installed package, or from the source tree where it is used without installation."""
    try:
        return resources.files(package).joinpath(name).read_text(encoding="utf-8")
    except (FileNotFoundError, ModuleNotFoundError, TypeError):
        return (Path(__file__).parent / package.split(".", 1)[1].replace(".", "/") / name).read_text(encoding="utf-8")
