"""Bytes for download and manifest tests: deterministic blobs, archives in memory, their sha256."""
from __future__ import annotations

import hashlib

from hnclip.rehearsal.archive_writers import tar_bytes, tar_gz, zip_bytes  # noqa: F401 - the archives tests build


def blob(size: int = 3 << 19, seed: int = 0) -> bytes:
    """Deterministic, incompressible-looking bytes."""
    out, counter = bytearray(), 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}-{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
