"""Resumable, verified, atomic downloads, and safe archive extraction.

A file is fetched into `<dest>.part`, resuming with an HTTP Range request from the bytes already
there. Only a .part whose hash matches is renamed onto `<dest>`, and only then is the marker
`<dest>.complete` written (size, mtime, hashes). So `dest` existing means "verified", and a later call
trusts the marker instead of re-hashing gigabytes. Transient failures (connection errors, HTTP 5xx,
bodies shorter than their Content-Length) are retried with exponential backoff; everything else fails
at once with a `DownloadError` that says what to do.

`download_dataset` applies this to every automatic file of a source (see sources.py) and unpacks its
archives into `<root>/<source>/extracted/`: each archive is unpacked into a temporary folder first,
then moved into place, and its marker in `extracted/.complete/` is written last.
"""
from __future__ import annotations

import fnmatch
import logging
import os
import re
import shutil
import socket
import sys
import tarfile
import tempfile
import time
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import requests
import urllib3.exceptions
from tqdm import tqdm

from hnclip.data.sources import Source, SourceFile, get_source, resolve_url
from hnclip.errors import UserError
from hnclip.io import read_json, write_json
from hnclip.provenance.hashing import hash_file, sha256_file

log = logging.getLogger(__name__)

CHUNK = 1 << 20          # hashing and copying
STREAM_CHUNK = 1 << 18   # network reads: a dropped connection loses at most the chunk in flight
SUPPORTED_HASHES = ("sha256", "md5", "sha1")


class DownloadError(UserError, RuntimeError):
    """A download or extraction that did not end in a verified file."""


class OfflineError(DownloadError):
    """The host could not be reached at all (connection refused, DNS failure, connect timeout)."""


class ChecksumMismatch(DownloadError):
    def __init__(self, message: str, expected: str | int | None = None, got: str | int | None = None):
        super().__init__(message)
        self.expected = expected
        self.got = got


class ManualStepRequired(DownloadError):
    """A file that cannot be fetched automatically (licence click-through) is not in place yet."""


class ArchiveError(DownloadError):
    """An archive that cannot be unpacked safely: corrupt, truncated, or with unsafe member paths."""


class _Transient(Exception):
    """A failure worth retrying; `unreachable` if the host could not be contacted at all."""

    def __init__(self, reason: str, unreachable: bool = False):
        super().__init__(reason)
        self.unreachable = unreachable


# ---------------------------------------------------------------------------------------------
# Hashes and markers
# ---------------------------------------------------------------------------------------------

def part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


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


def _check_algorithm(algorithm: str) -> None:
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


# ---------------------------------------------------------------------------------------------
# One file
# ---------------------------------------------------------------------------------------------

def download_file(url: str, dest: str | os.PathLike, expected_hash: str | None, algorithm: str = "sha256",
                  retries: int = 4, backoff: float = 1.0, progress: bool = True,
                  session: requests.Session | None = None, *, expected_size: int | None = None,
                  timeout: tuple[float, float] = (10.0, 60.0)) -> Path:
    """Fetch `url` to `dest`, resuming and retrying; return `dest` once it verifies.

    `expected_hash=None` accepts any content (the sha256 seen is logged and kept in the marker so
    it can be pinned). A checksum mismatch deletes the .part and raises ChecksumMismatch; it is not
    retried, since the server would most likely send the same bytes again.
    """
    _check_algorithm(algorithm)
    dest = Path(dest)
    if verify_existing(dest, expected_hash, algorithm, expected_size, url):
        log.info("%s: already verified", dest)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(dest)
    own_session = session is None
    session = session or requests.Session()
    try:
        _fetch_with_retries(session, url, dest, part, expected_hash, algorithm, retries, backoff, progress, timeout)
    finally:
        if own_session:
            session.close()
    try:
        hashes = _verify(part, expected_hash, algorithm, expected_size, url)
    except ChecksumMismatch:
        part.unlink(missing_ok=True)  # a wrong body must not be resumed from
        raise
    os.replace(part, dest)
    _write_marker(dest, hashes, algorithm, expected_hash, url)
    return dest


def _fetch_with_retries(session, url, dest, part, expected_hash, algorithm, retries, backoff, progress, timeout) -> None:
    last: _Transient | None = None
    attempts = retries + 1
    for attempt in range(attempts):
        if attempt:
            delay = backoff * 2 ** (attempt - 1)
            log.warning("%s: %s; retry %d/%d in %.3g s", url, last, attempt, retries, delay)
            time.sleep(delay)
        try:
            _fetch_once(session, url, part, progress, timeout)
            return
        except _Transient as failure:
            last = failure
    if last is not None and last.unreachable:
        raise OfflineError(
            f"could not reach the host of {url} in {attempts} attempt(s) ({last}). We seem to be offline "
            f"(or the host is down). Fetch the file by hand and put it at {dest}"
            + (f" ({algorithm} {expected_hash})" if expected_hash else "")
            + "; the next run verifies it and carries on.")
    raise DownloadError(f"gave up on {url} after {attempts} attempt(s): {last}. The bytes so far are kept in "
                        f"{part}; rerunning resumes from there.")


def _fetch_once(session: requests.Session, url: str, part: Path, progress: bool, timeout) -> None:
    """One request: append to (or restart) the .part. Raises _Transient for anything retryable."""
    offset = part.stat().st_size if part.exists() else 0
    headers = {"Accept-Encoding": "identity"}  # byte ranges and hashes refer to the stored bytes
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        response = session.get(url, headers=headers, stream=True, timeout=timeout)
    except (requests.ConnectionError, requests.Timeout) as error:
        raise _Transient(_describe(error), unreachable=_is_unreachable(error)) from error
    with response:
        status = response.status_code
        if status == 416:
            _handle_unsatisfiable_range(response, part, offset)
            return
        if status == 429 or status >= 500:
            raise _Transient(f"HTTP {status} {response.reason}")
        if status not in (200, 206):
            raise DownloadError(f"HTTP {status} {response.reason} for {url}; not retried. Check the URL in "
                                f"hnclip/data/sources.py (or the mirror), or fetch the file by hand.")
        if status == 206 and _range_start(response) != offset:
            part.unlink(missing_ok=True)
            raise _Transient("server answered a different byte range than asked; restarting from zero")
        if status == 200 and offset:
            log.warning("%s: server ignored the Range request; restarting from zero", url)
            offset = 0
        total = _total_length(response, status, offset)
        received = _stream_body(response, part, offset, total, progress)
    if total is not None and offset + received < total:
        raise _Transient(f"body truncated: have {offset + received} of {total} bytes")


def _stream_body(response: requests.Response, part: Path, offset: int, total: int | None, progress: bool) -> int:
    received = 0
    mode = "ab" if offset else "wb"
    with open(part, mode) as handle, tqdm(total=total, initial=offset, unit="B", unit_scale=True,
                                          unit_divisor=1024, desc=part.name[: -len(".part")],
                                          disable=not progress, leave=False) as bar:
        try:
            # raw stream, undecoded: a .tar.gz served with Content-Encoding: gzip must stay gzipped
            for chunk in response.raw.stream(STREAM_CHUNK, decode_content=False):
                handle.write(chunk)
                received += len(chunk)
                bar.update(len(chunk))
        except (urllib3.exceptions.HTTPError, requests.RequestException, ConnectionError, TimeoutError) as error:
            raise _Transient(f"connection broken after {offset + received} bytes ({_describe(error)})") from error
    return received


def _handle_unsatisfiable_range(response: requests.Response, part: Path, offset: int) -> None:
    """416: the .part may already hold the whole file; otherwise it is stale, start over."""
    match = re.match(r"bytes \*/(\d+)", response.headers.get("Content-Range", ""))
    if match and int(match.group(1)) == offset:
        return
    part.unlink(missing_ok=True)
    raise _Transient("server refused the resume range; restarting from zero")


def _range_start(response: requests.Response) -> int | None:
    match = re.match(r"bytes (\d+)-\d+/(\d+|\*)", response.headers.get("Content-Range", ""))
    return int(match.group(1)) if match else None


def _total_length(response: requests.Response, status: int, offset: int) -> int | None:
    if status == 206:
        match = re.match(r"bytes \d+-\d+/(\d+)", response.headers.get("Content-Range", ""))
        if match:
            return int(match.group(1))
    length = response.headers.get("Content-Length")
    return offset + int(length) if length is not None and length.isdigit() else None


def _is_unreachable(error: BaseException) -> bool:
    """Connection refused, DNS failure or connect timeout anywhere in the exception chain."""
    unreachable = (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError,
                   ConnectionRefusedError, socket.gaierror, requests.ConnectTimeout)
    stack, seen = [error], set()
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, unreachable):
            return True
        stack.extend([current.__cause__, current.__context__, getattr(current, "reason", None)])
        stack.extend(arg for arg in getattr(current, "args", ()) if isinstance(arg, BaseException))
    return False


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


# ---------------------------------------------------------------------------------------------
# Archives
# ---------------------------------------------------------------------------------------------

def extract_archive(archive: str | os.PathLike, extracted_dir: str | os.PathLike, subdir: str = "", *,
                    only: str | None = None, flatten: bool = False) -> Path:
    """Unpack a .tar/.tar.gz/.zip into `extracted_dir/subdir`, merging with what is there.

    Skipped if this archive (same sha256) was already unpacked there. Raises ArchiveError on a
    corrupt archive or an unsafe member path; the temporary folder is removed and no marker written.
    """
    archive, extracted_dir = Path(archive), Path(extracted_dir)
    target = extracted_dir / subdir
    marker = extracted_dir / ".complete" / f"{archive.name}.json"
    archive_sha256 = recorded_sha256(archive)
    if _extraction_done(marker, archive_sha256, subdir, target):
        return target
    extracted_dir.mkdir(parents=True, exist_ok=True)
    for stale in extracted_dir.glob(f".extracting-{archive.name}-*"):  # left by a killed run
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".extracting-{archive.name}-", dir=extracted_dir))
    try:
        count = _unpack(archive, staging, only, flatten)
        _merge_move(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    write_json(marker, {"archive": archive.name, "sha256": archive_sha256, "subdir": subdir, "files": count})
    log.info("unpacked %d files from %s into %s", count, archive.name, target)
    return target


def _extraction_done(marker: Path, archive_sha256: str, subdir: str, target: Path) -> bool:
    try:
        done = read_json(marker)
    except (FileNotFoundError, ValueError):
        return False
    return done.get("sha256") == archive_sha256 and done.get("subdir") == subdir and target.is_dir()


def _unpack(archive: Path, staging: Path, only: str | None, flatten: bool) -> int:
    try:
        if archive.name.endswith(".zip"):
            return _unpack_zip(archive, staging, only, flatten)
        return _unpack_tar(archive, staging, only, flatten)
    except ArchiveError:
        raise
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, OSError) as error:
        raise ArchiveError(f"cannot unpack {archive}: {_describe(error)}. The archive is corrupt or "
                           f"incomplete; nothing was marked as extracted.") from error


def _unpack_tar(archive: Path, staging: Path, only: str | None, flatten: bool) -> int:
    count = 0
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            name = safe_member_path(member.name, archive)
            if not member.isfile():  # folders are implied; links and devices are never unpacked
                continue
            source = tar.extractfile(member)
            if _wanted(name, only) and source is not None:
                _write_member(source, staging, name, flatten)
                count += 1
    return count


def _unpack_zip(archive: Path, staging: Path, only: str | None, flatten: bool) -> int:
    count = 0
    with zipfile.ZipFile(archive) as bundle:
        for info in bundle.infolist():
            name = safe_member_path(info.filename, archive)
            if info.is_dir() or not _wanted(name, only):
                continue
            with bundle.open(info) as source:  # raises BadZipFile on a CRC error
                _write_member(source, staging, name, flatten)
            count += 1
    return count


def safe_member_path(name: str, archive: Path | str = "archive") -> str:
    """The member's path, normalised; ArchiveError if it is absolute or climbs out with '..'."""
    normalised = name.replace("\\", "/")
    parts = [part for part in normalised.split("/") if part not in ("", ".")]
    if normalised.startswith("/") or re.match(r"^[A-Za-z]:", normalised) or ".." in parts:
        raise ArchiveError(f"{archive}: unsafe member path {name!r} (absolute or climbing out with '..'); "
                           f"refusing to unpack this archive")
    return "/".join(parts)


def _wanted(name: str, only: str | None) -> bool:
    return bool(name) and (only is None or fnmatch.fnmatch(name.rsplit("/", 1)[-1], only))


def _write_member(source, staging: Path, name: str, flatten: bool) -> None:
    out = staging / (name.rsplit("/", 1)[-1] if flatten else name)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as handle:
        shutil.copyfileobj(source, handle, CHUNK)


def _merge_move(source: Path, target: Path) -> None:
    """Move everything under `source` into `target`, keeping what `target` already holds
    (e.g. photos placed there by hand); files of the same name are replaced."""
    target.mkdir(parents=True, exist_ok=True)
    for child in source.iterdir():
        destination = target / child.name
        if child.is_dir() and destination.is_dir():
            _merge_move(child, destination)
        elif destination.is_dir():
            raise ArchiveError(f"cannot unpack file {child.name!r}: {destination} is a folder")
        else:
            if child.is_dir() and destination.exists():
                destination.unlink()
            os.replace(child, destination)


# ---------------------------------------------------------------------------------------------
# A whole source
# ---------------------------------------------------------------------------------------------

@dataclass
class DatasetFiles:
    """What `download_dataset` left in place."""
    name: str
    dataset_dir: Path
    raw: dict[str, Path] = field(default_factory=dict)   # verified raw files by name
    pending_manual: list[str] = field(default_factory=list)

    @property
    def raw_dir(self) -> Path:
        return self.dataset_dir / "raw"

    @property
    def extracted_dir(self) -> Path:
        return self.dataset_dir / "extracted"


def download_dataset(name: str, root: str | os.PathLike, mirror: str | None = None, *,
                     source: Source | None = None, retries: int = 4, backoff: float = 1.0,
                     progress: bool = True, session: requests.Session | None = None,
                     require_manual: bool = True) -> DatasetFiles:
    """Download every automatic file of source `name` into `root/name/raw/`, check the manual ones,
    and unpack the archives into `root/name/extracted/`.

    A missing manual file is reported after everything else is done: its instructions go to stderr,
    and ManualStepRequired is raised if `require_manual` (else they are in `pending_manual`).
    `source` overrides the table entry (tests, or a mirror with its own pins).
    """
    source = source or get_source(name)
    result = DatasetFiles(name=name, dataset_dir=Path(root) / name)
    for source_file in source.files:
        if not source_file.manual:
            url = resolve_url(name, source_file, mirror)
            result.raw[source_file.name] = download_file(
                url, result.raw_dir / source_file.name, source_file.checksum, source_file.algorithm,
                retries=retries, backoff=backoff, progress=progress, session=session,
                expected_size=source_file.size)
    for source_file in source.files:
        if source_file.manual:
            _check_manual_file(source, source_file, result)
    for file_name, path in result.raw.items():
        source_file = source.file(file_name)
        if source_file.is_archive:
            _extract_source_archive(source_file, path, result.extracted_dir)
    if result.pending_manual:
        message = "\n\n".join(result.pending_manual)
        print(message, file=sys.stderr)
        if require_manual:
            raise ManualStepRequired(message)
    return result


def _check_manual_file(source: Source, source_file: SourceFile, result: DatasetFiles) -> None:
    path = result.raw_dir / source_file.name
    if path.exists():
        if not verify_existing(path, source_file.checksum, source_file.algorithm, source_file.size):
            pin = f"{source_file.algorithm} {source_file.checksum or '(unpinned)'}, size {source_file.size or '?'}"
            raise ChecksumMismatch(f"{path} (placed by hand) does not verify against sources.py ({pin}); "
                                   f"it was left in place: replace it with a good copy", source_file.checksum)
        result.raw[source_file.name] = path
    elif not (source_file.satisfied_by and _has_files(result.extracted_dir / source_file.satisfied_by)):
        result.pending_manual.append(manual_instructions(source.name, source_file, result.dataset_dir))


def manual_instructions(source_name: str, source_file: SourceFile, dataset_dir: Path) -> str:
    raw = dataset_dir / "raw" / source_file.name
    lines = [f"[{source_name}] manual step required: {source_file.name}", source_file.instructions,
             f"Then put it at {raw}"]
    pin = (f"; it is checked against {source_file.algorithm} {source_file.checksum}" if source_file.checksum
           else "; no checksum is pinned yet, the sha256 seen is recorded next to it")
    lines[-1] += pin
    if source_file.is_archive:
        lines[-1] += f" and unpacked into {dataset_dir / 'extracted' / source_file.extract_to}"
    if source_file.satisfied_by:
        lines.append(f"(or unpack it yourself so that {dataset_dir / 'extracted' / source_file.satisfied_by} "
                     f"holds the files{' ' + source_file.extract_only if source_file.extract_only else ''}).")
    lines.append("Then rerun the download.")
    return "\n".join(line for line in lines if line)


def _extract_source_archive(source_file: SourceFile, path: Path, extracted_dir: Path) -> None:
    try:
        extract_archive(path, extracted_dir, source_file.extract_to,
                        only=source_file.extract_only, flatten=source_file.flatten)
    except ArchiveError as error:
        # An archive that will not unpack is not a complete download: drop its marker, and the
        # file itself when nothing pins it (so the next run fetches it again instead of trusting it).
        marker_path(path).unlink(missing_ok=True)
        if source_file.checksum is None and not source_file.manual:
            path.unlink(missing_ok=True)
            raise ArchiveError(f"{error} {path.name} was deleted; the next run downloads it again.") from error
        raise


def _has_files(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())
