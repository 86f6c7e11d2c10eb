"""The one place content hashes are computed: files, bytes, canonical JSON and model weights."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

_file_cache: dict[tuple[str, int, int], str] = {}


def sha256_file(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, streamed (`hashlib.file_digest`)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """`sha256_file`, memoised per (path, size, mtime) within this process (records hash an input
    several times; a changed file has a new size or mtime)."""
    stat = os.stat(path)
    key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _file_cache:
        _file_cache[key] = sha256_file(path)
    return _file_cache[key]


def hash_file(path: str | os.PathLike, algorithms: tuple[str, ...] | list[str] = ("sha256",)) -> dict[str, str]:
    """Several hashes of a file in one pass (the pinned algorithm plus sha256 for the manifests)."""
    digests = {name: hashlib.new(name) for name in dict.fromkeys(algorithms)}
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            for digest in digests.values():
                digest.update(block)
    return {name: digest.hexdigest() for name, digest in digests.items()}


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(obj: Any) -> str:
    """Key-sorted, whitespace-free JSON: the form that content hashes are taken over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def json_sha256(obj: Any) -> str:
    """sha256 of an object's canonical JSON (run specs, init specs, generator fingerprints)."""
    return sha256_bytes(canonical_json(obj).encode("utf-8"))


def state_dict_digest(state_dict: dict) -> str:
    """sha256 over the raw bytes of a state dict's tensors, in key order: names the exact weights."""
    digest = hashlib.sha256()
    for key, tensor in state_dict.items():
        digest.update(key.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(_uint8()).numpy().tobytes())
    return digest.hexdigest()


def weights_digest(model) -> str:
    """`state_dict_digest` of a module."""
    return state_dict_digest(model.state_dict())


def _uint8():
    import torch  # only weight digests need torch; Snakefile parsing imports this module without it
    return torch.uint8
