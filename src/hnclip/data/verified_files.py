"""Checksum verification and the `.complete` markers of verified files.

A file is verified against its pin (or, unpinned, has its sha256 recorded) before it is moved onto its
destination, and only then is the marker `<dest>.complete` written (size, mtime, hashes). So `dest`
existing means "verified", and a later call trusts the marker instead of re-hashing gigabytes, as long
as the file's size and mtime are those the marker recorded.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from hnclip.data.download_errors import ChecksumMismatch
from hnclip.hashing import hash_file, sha256_file
from hnclip.io import read_json, write_json

log = logging.getLogger(__name__)

SUPPORTED_HASHES = ("sha256", "md5", "sha1")


def marker_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".complete")


def read_marker(dest: str | os.PathLike) -> dict | None:
    """The marker of a verified file, or None if there is none or the file changed since."""
    dest = Path(dest)
    try:
        marker = read_json(marker_path(dest))
        stat = dest.stat()
    except (FileNotFoundError, ValueError):
        return None
    if marker.get("size") != stat.st_size or marker.get("mtime_ns") != stat.st_mtime_ns:
        return None
    return marker


def verification_facts(dest: str | os.PathLike) -> dict:
    """What a verified file's marker says, for records: its sha256 and size, the pin it was checked
    against (None: unpinned, the sha256 is the one recorded on its first verified download), the URL."""
    marker = read_marker(dest) or {}
    pinned = marker.get("pinned")
    return {"sha256": marker.get("sha256"), "size": marker.get("size"), "algorithm": marker.get("algorithm"),
            "pinned": pinned, "url": marker.get("url"),
            "checked": "against the pin" if pinned else "recorded on first verified download (no pin)"}


def recorded_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file, from its verification marker when that is still valid (no re-hash of GBs)."""
    marker = read_marker(path)
    if marker and marker.get("sha256"):
        return marker["sha256"]
    return sha256_file(path)


def _write_marker(dest: Path, hashes: dict[str, str], algorithm: str, pinned: str | None, url: str | None) -> None:
    stat = dest.stat()
    write_json(marker_path(dest), {
        "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "algorithm": algorithm,
        **hashes, "pinned": pinned, "url": url,
    })


def check_algorithm(algorithm: str) -> None:
    if algorithm not in SUPPORTED_HASHES:
        raise ValueError(f"unsupported hash algorithm {algorithm!r}; use one of {SUPPORTED_HASHES}")


def _verify(path: Path, expected: str | None, algorithm: str, expected_size: int | None, what: str) -> dict[str, str]:
    """Hash `path` and compare; raise ChecksumMismatch (the caller decides whether to delete)."""
    size = path.stat().st_size
    if expected_size is not None and size != expected_size:
        raise ChecksumMismatch(f"{what}: size is {size} bytes, expected {expected_size}", expected_size, size)
    hashes = hash_file(path, (algorithm, "sha256"))
    if expected is not None and hashes[algorithm] != expected.lower():
        raise ChecksumMismatch(f"{what}: {algorithm} mismatch: expected {expected.lower()}, got {hashes[algorithm]}",
                               expected.lower(), hashes[algorithm])
    if expected is None:
        log.warning("%s is not pinned; its sha256 is %s: pin it in hnclip/data/sources.py", what, hashes["sha256"])
    return hashes


def verify_existing(dest: str | os.PathLike, expected: str | None, algorithm: str = "sha256",
                    expected_size: int | None = None, url: str | None = None) -> bool:
    """True if `dest` is already a verified copy (marker trusted, else re-hashed and marked)."""
    dest = Path(dest)
    if not dest.is_file():
        return False
    marker = read_marker(dest)
    if marker is not None and (expected is None or marker.get(algorithm) == expected.lower()):
        return True
    try:
        hashes = _verify(dest, expected, algorithm, expected_size, str(dest))
    except ChecksumMismatch as mismatch:
        log.warning("existing %s does not verify (%s)", dest, mismatch)
        return False
    _write_marker(dest, hashes, algorithm, expected, url)
    return True


def commit_verified(fetched: Path, dest: Path, expected: str | None, algorithm: str, expected_size: int | None,
                    url: str | None) -> None:
    """Verify `fetched`, move it onto `dest` and write the marker; a wrong body is deleted."""
    try:
        hashes = _verify(fetched, expected, algorithm, expected_size, url or str(dest))
    except ChecksumMismatch:
        fetched.unlink(missing_ok=True)  # a wrong body must not be resumed from
        raise
    os.replace(fetched, dest)
    _write_marker(dest, hashes, algorithm, expected, url)
