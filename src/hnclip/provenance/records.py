"""Provenance records: what produced an artifact (code, params, inputs, libraries, device, time)."""
from __future__ import annotations

import datetime as _dt
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from hnclip.hashing import file_sha256

LIBRARIES = ("torch", "torchvision", "open_clip_torch", "numpy", "pandas", "matplotlib", "snakemake", "dvc")


def code_name(function) -> str | None:
    """How a record names the code that computed it: the function's importable name, module.qualname
    (`importlib.import_module(module)` then its attributes give the function back); None for none."""
    if function is None:
        return None
    return f"{function.__module__}.{getattr(function, '__qualname__', type(function).__qualname__)}"


def git_state(root: str | Path = ".") -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        # Dirty: a tracked file differs from the commit (staged or not). Untracked files do not count
        # (--untracked-files=no): a new file no tracked code imports cannot change an output; outputs
        # (results/, figures/, data/) are ignored by git anyway.
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
        return {"commit": commit, "dirty": dirty}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None, "note": "not a git checkout"}


def library_versions() -> dict:
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def input_hashes(inputs: dict[str, str | Path]) -> dict:
    return {name: {"path": str(path), "sha256": file_sha256(path)} for name, path in sorted(inputs.items())}


def record(kind: str, inputs: dict[str, str | Path] | None = None, spec: dict | None = None,
           spec_hash: str | None = None, params: Any = None, device: dict | None = None,
           wall_time_s: float | None = None, extra: dict | None = None) -> dict:
    rec = {
        "kind": kind,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git": git_state(),
        "libraries": library_versions(),
        "host": platform.node(),
        "inputs": input_hashes(inputs or {}),
    }
    for key, value in (("spec", spec), ("spec_hash", spec_hash), ("params", params), ("device", device),
                       ("wall_time_s", wall_time_s)):
        if value is not None:
            rec[key] = value
    rec.update(extra or {})
    return rec
