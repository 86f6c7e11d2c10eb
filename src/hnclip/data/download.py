"""Resumable, verified, atomic downloads, and safe archive extraction.

A file is fetched into `<dest>.part`, resuming with an HTTP Range request from the bytes already
there. Only a .part whose hash matches is renamed onto `<dest>`, and only then is the marker
`<dest>.complete` written (size, mtime, hashes). So `dest` existing means "verified", and a later call
trusts the marker instead of re-hashing gigabytes. Each request retries connection failures and
HTTP 429/5xx answers itself (urllib3 `Retry`: exponential backoff, Retry-After honoured); a body that
breaks off mid-way is resumed from the .part. Everything else fails at once with a `DownloadError`
that says what to do.

Files hosted on the Hugging Face Hub (`hub_repo` in sources.py) are fetched with `hf_hub_download` at
their pinned commit instead, then verified and marked the same way.

`download_dataset` applies this to every automatic file of a source (see sources.py) and unpacks its
archives into `<root>/<source>/extracted/`: each archive is unpacked into a temporary folder first,
then moved into place, and its marker in `extracted/.complete/` is written last.
"""
from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import re
import shutil
import socket
import sys
import tarfile
import tempfile
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import requests
import urllib3.exceptions
from requests.adapters import HTTPAdapter
from tqdm import tqdm
from urllib3.util import Retry

from hnclip.data.sources import MIRROR_ENV, Source, SourceFile, get_source, mirror_base, resolve_url
from hnclip.errors import UserError
from hnclip.hashing import hash_file, sha256_file
from hnclip.io import read_json, write_json

log = logging.getLogger(__name__)

CHUNK = 1 << 20          # copying archive members
STREAM_CHUNK = 1 << 18   # network reads: a dropped connection loses at most the chunk in flight
SUPPORTED_HASHES = ("sha256", "md5", "sha1")
RETRY_STATUSES = frozenset({429, *range(500, 600)})  # answers worth asking again; any other error is final


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


class _Interrupted(Exception):
    """A response whose body broke off (or answered the wrong byte range): resume from the .part."""


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
# One file over plain HTTP
# ---------------------------------------------------------------------------------------------

def retrying_session(retries: int = 4, backoff: float = 1.0) -> requests.Session:
    """A Session whose requests retry connection failures and 429/5xx answers up to `retries` times,
    `backoff` * 2**n seconds apart (or as long as a Retry-After header asks)."""
    retry = Retry(total=retries, backoff_factor=backoff, status_forcelist=RETRY_STATUSES,
                  allowed_methods=frozenset({"GET", "HEAD"}), respect_retry_after_header=True,
                  raise_on_status=False)  # the last 429/5xx comes back as a response: _fetch_once words the error
    adapter = HTTPAdapter(max_retries=retry)
    session = requests.Session()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def download_file(url: str, dest: str | os.PathLike, expected_hash: str | None, algorithm: str = "sha256",
                  retries: int = 4, backoff: float = 1.0, progress: bool = True,
                  session: requests.Session | None = None, *, expected_size: int | None = None,
                  timeout: tuple[float, float] = (10.0, 60.0)) -> Path:
    """Fetch `url` to `dest`, resuming and retrying; return `dest` once it verifies.

    `session` defaults to `retrying_session(retries, backoff)`. `expected_hash=None` accepts any
    content (the sha256 seen is logged and kept in the marker so it can be pinned). A checksum
    mismatch deletes the .part and raises ChecksumMismatch; it is not retried, since the server would
    most likely send the same bytes again.
    """
    _check_algorithm(algorithm)
    dest = Path(dest)
    if verify_existing(dest, expected_hash, algorithm, expected_size, url):
        log.info("%s: already verified", dest)
        return dest
    if not url:  # a file only a mirror serves (the rehearsal's table), asked for without one
        raise DownloadError(f"{dest.name} has no URL of its own: set {MIRROR_ENV} to a mirror that serves it, "
                            f"or put it at {dest} by hand")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(dest)
    own_session = session is None
    session = session or retrying_session(retries, backoff)
    try:
        _fetch_resuming(session, url, dest, part, expected_hash, algorithm, retries, backoff, progress, timeout)
    finally:
        if own_session:
            session.close()
    _commit_verified(part, dest, expected_hash, algorithm, expected_size, url)
    return dest


def _commit_verified(fetched: Path, dest: Path, expected: str | None, algorithm: str, expected_size: int | None,
                     url: str | None) -> None:
    """Verify `fetched`, move it onto `dest` and write the marker; a wrong body is deleted."""
    try:
        hashes = _verify(fetched, expected, algorithm, expected_size, url or str(dest))
    except ChecksumMismatch:
        fetched.unlink(missing_ok=True)  # a wrong body must not be resumed from
        raise
    os.replace(fetched, dest)
    _write_marker(dest, hashes, algorithm, expected, url)


def _fetch_resuming(session, url, dest, part, expected_hash, algorithm, retries, backoff, progress, timeout) -> None:
    """Fetch into `part` until its body is complete. The session's Retry cannot help once a response
    has been handed over, so a body that breaks off is resumed here, counted and spaced by a Retry too."""
    resumes = Retry(total=retries, backoff_factor=backoff)
    while True:
        try:
            _fetch_once(session, url, part, progress, timeout)
            return
        except _Interrupted as broken:
            try:
                resumes = resumes.increment(method="GET", url=url, error=broken)
            except urllib3.exceptions.MaxRetryError:
                raise DownloadError(f"gave up on {url} after {len(resumes.history) + 1} attempt(s): {broken}. "
                                    f"The bytes so far are kept in {part}; rerunning resumes from there.") from None
            log.warning("%s: %s; resuming (%d/%d)", url, broken, len(resumes.history), retries)
            resumes.sleep()
        except (requests.ConnectionError, requests.Timeout) as error:  # the session has retried already
            if _is_unreachable(error):
                raise OfflineError(_offline_message(url, _describe(error), dest, algorithm, expected_hash)) from error
            raise DownloadError(f"gave up on {url} after {retries + 1} attempt(s): {_describe(error)}. "
                                f"Rerunning resumes from the bytes kept in {part}.") from error


def _offline_message(what: str, reason: str, dest: Path, algorithm: str, expected: str | None) -> str:
    return (f"could not reach the host of {what} ({reason}). We seem to be offline (or the host is down). "
            f"Fetch the file by hand and put it at {dest}" + (f" ({algorithm} {expected})" if expected else "")
            + "; the next run verifies it and carries on.")


def _fetch_once(session: requests.Session, url: str, part: Path, progress: bool, timeout) -> None:
    """One request: append to (or restart) the .part. Raises _Interrupted when the body is incomplete."""
    offset = part.stat().st_size if part.exists() else 0
    headers = {"Accept-Encoding": "identity"}  # byte ranges and hashes refer to the stored bytes
    if offset:
        headers["Range"] = f"bytes={offset}-"
    with session.get(url, headers=headers, stream=True, timeout=timeout) as response:
        status = response.status_code
        if status == 416:
            _handle_unsatisfiable_range(response, part, offset)
            return
        if status in RETRY_STATUSES:
            retried = response.raw.retries
            attempts = len(retried.history) + 1 if retried else 1
            raise DownloadError(f"gave up on {url} after {attempts} attempt(s): HTTP {status} {response.reason}. "
                                f"The host is failing; rerun later" + (f" (the bytes so far are kept in {part})."
                                                                       if offset else "."))
        if status not in (200, 206):
            raise DownloadError(f"HTTP {status} {response.reason} for {url}; not retried. Check the URL in "
                                f"hnclip/data/sources.py (or the mirror), or fetch the file by hand.")
        if status == 206 and _range_start(response) != offset:
            part.unlink(missing_ok=True)
            raise _Interrupted("server answered a different byte range than asked; restarting from zero")
        if status == 200 and offset:
            log.warning("%s: server ignored the Range request; restarting from zero", url)
            offset = 0
        total = _total_length(response, status, offset)
        received = _stream_body(response, part, offset, total, progress)
    if total is not None and offset + received < total:
        raise _Interrupted(f"body truncated: have {offset + received} of {total} bytes")


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
            raise _Interrupted(f"connection broken after {offset + received} bytes ({_describe(error)})") from error
    return received


def _handle_unsatisfiable_range(response: requests.Response, part: Path, offset: int) -> None:
    """416: the .part may already hold the whole file; otherwise it is stale, start over."""
    match = re.match(r"bytes \*/(\d+)", response.headers.get("Content-Range", ""))
    if match and int(match.group(1)) == offset:
        return
    part.unlink(missing_ok=True)
    raise _Interrupted("server refused the resume range; restarting from zero")


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
# One file from the Hugging Face Hub
# ---------------------------------------------------------------------------------------------

def download_hub_file(source_file: SourceFile, dest: str | os.PathLike, *, progress: bool = True) -> Path:
    """Fetch a Hub file with `hf_hub_download` at its pinned commit; return `dest` once it verifies.

    The library does the transfer: the Hub's redirects and Xet storage, tokens for gated repos,
    retries, resuming a broken body within the call, and copying a file already in the Hugging Face
    cache. It keeps no partial bytes across runs, so a killed transfer starts over. The file lands in
    `.hub-<name>/` next to `dest` and is moved onto `dest` only once it verifies, like any download.
    """
    _check_algorithm(source_file.algorithm)
    dest, expected = Path(dest), source_file.checksum
    if verify_existing(dest, expected, source_file.algorithm, source_file.size, source_file.url):
        log.info("%s: already verified", dest)
        return dest
    if dest.is_file() and (old := source_file.superseded_by_this(dest.stat().st_size)):
        log.warning("%s has the size of %s; fetching the current release to replace it", dest, old.what)
    commit = _pinned_commit(source_file, dest)
    # imported here: only Hub files need them, and they add ~0.15 s to every hnclip start
    from httpx2 import HTTPError
    from huggingface_hub import hf_hub_download, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    from huggingface_hub.utils import disable_progress_bars

    url = hf_hub_url(source_file.hub_repo, source_file.name, repo_type=source_file.hub_repo_type, revision=commit)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.with_name(f".hub-{dest.name}")
    try:
        with contextlib.nullcontext() if progress else disable_progress_bars():
            fetched = hf_hub_download(source_file.hub_repo, source_file.name, repo_type=source_file.hub_repo_type,
                                      revision=commit, local_dir=staging)
        _commit_verified(Path(fetched), dest, expected, source_file.algorithm, source_file.size, url)
    except ChecksumMismatch as mismatch:
        raise _naming_superseded(mismatch, source_file) from None
    except LocalEntryNotFoundError as error:  # no copy anywhere: offline, unless the Hub answered with an error
        if isinstance(error.__cause__, HfHubHTTPError):
            raise _hub_error(url, error.__cause__, dest) from error
        raise OfflineError(_offline_message(url, _describe(error), dest, source_file.algorithm, expected)) from error
    except (HTTPError, OSError) as error:
        raise _hub_error(url, error, dest) from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


def _naming_superseded(mismatch: ChecksumMismatch, source_file: SourceFile) -> ChecksumMismatch:
    """The mismatch, saying what the file is when its checksum or size is that of an upload the
    source table marks superseded, and where the current release is."""
    old = source_file.superseded_by_this(mismatch.got)
    if old is None:
        return mismatch
    where = f" ({source_file.url})" if source_file.url else ""
    return ChecksumMismatch(f"{mismatch}. This is {old.what}. Use the current release{where}: "
                            f"{source_file.algorithm} {source_file.checksum}", mismatch.expected, mismatch.got)


def _hub_error(url: str, error: BaseException, dest: Path) -> DownloadError:
    return DownloadError(f"could not fetch {url}: {_describe(error)}. Check hub_repo and revision in "
                         f"hnclip/data/sources.py, set {MIRROR_ENV} to a mirror, or put the file at {dest} by hand.")


def _pinned_commit(source_file: SourceFile, dest: Path) -> str:
    """The full commit a Hub file is pinned to; a branch or tag could move, so anything else is refused."""
    if source_file.revision and re.fullmatch(r"[0-9a-f]{40}", source_file.revision):
        return source_file.revision
    prefix = "datasets/" if source_file.hub_repo_type == "dataset" else ""
    pin = f"{source_file.algorithm} {source_file.checksum}" if source_file.checksum else "the content you checked"
    raise DownloadError(
        f"{source_file.name} comes from the Hugging Face Hub ({prefix}{source_file.hub_repo}), but "
        f"hnclip/data/sources.py pins no commit for it (revision={source_file.revision!r}). Pin one: from "
        f"https://huggingface.co/{prefix}{source_file.hub_repo}/commits/main pick the full 40-character commit "
        f"whose {source_file.name} has {pin}, and set revision='<commit>' on its entry. Until then, set "
        f"{MIRROR_ENV} to a mirror or put the file at {dest} by hand.")


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
        _unpack(archive, staging, only, flatten)
        count = sum(1 for path in staging.rglob("*") if path.is_file())
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


def _unpack(archive: Path, staging: Path, only: str | None, flatten: bool) -> None:
    try:
        if archive.name.endswith(".zip"):
            _unpack_zip(archive, staging, only, flatten)
        else:
            with tarfile.open(archive, "r:*") as tar:
                tar.extractall(staging, filter=_tar_filter(only, flatten))
    except ArchiveError:
        raise
    except tarfile.FilterError as error:  # before TarError: it is one
        raise ArchiveError(f"{archive}: unsafe member path {error.tarinfo.name!r} ({error}); "
                           f"refusing to unpack this archive") from error
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, OSError) as error:
        raise ArchiveError(f"cannot unpack {archive}: {_describe(error)}. The archive is corrupt or "
                           f"incomplete; nothing was marked as extracted.") from error


def _tar_filter(only: str | None, flatten: bool):
    """tarfile's "data" filter (refuses members that would land outside the folder, drops unsafe
    modes), kept to regular files matching `only`, renamed to their base name if `flatten`."""
    def keep(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        if not member.isfile():  # folders are implied; links and devices are never unpacked
            return None
        filtered = tarfile.data_filter(member, dest)
        if filtered.name != member.name:  # the filter would make an absolute name relative: refuse, as for zips
            raise tarfile.AbsolutePathError(member)
        if not _wanted(member.name, only):
            return None
        return filtered.replace(name=member.name.rsplit("/", 1)[-1], deep=False) if flatten else filtered
    return keep


def _unpack_zip(archive: Path, staging: Path, only: str | None, flatten: bool) -> None:
    with zipfile.ZipFile(archive) as bundle:
        for info in bundle.infolist():
            name = safe_member_path(info.filename, archive)
            if info.is_dir() or not _wanted(name, only):
                continue
            with bundle.open(info) as source:  # raises BadZipFile on a CRC error
                _write_member(source, staging, name, flatten)


def safe_member_path(name: str, archive: Path | str = "archive") -> str:
    """A zip member's path, normalised; ArchiveError if it is absolute or climbs out with '..'.

    Kept by hand: zipfile has no refusing counterpart of tarfile's data filter (its extract() silently
    rewrites such names, which would hide a malicious archive), and `only`/`flatten` need the name."""
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
                     progress: bool = True, require_manual: bool = True) -> DatasetFiles:
    """Download every automatic file of source `name` into `root/name/raw/`, check the manual ones,
    and unpack the archives into `root/name/extracted/`.

    Hub files come through `download_hub_file` unless a mirror is set (a mirror serves every file
    at `<mirror>/<source>/<file name>`). A missing manual file is reported after everything else is
    done: its instructions go to stderr, and ManualStepRequired is raised if `require_manual` (else
    they are in `pending_manual`). `source` overrides the table entry (tests, or a mirror with its own pins).
    """
    source = source or get_source(name)
    result = DatasetFiles(name=name, dataset_dir=Path(root) / name)
    with retrying_session(retries, backoff) as session:
        for source_file in source.files:
            if source_file.manual:
                continue
            dest = result.raw_dir / source_file.name
            if source_file.hub_repo and mirror_base(mirror) is None:
                result.raw[source_file.name] = download_hub_file(source_file, dest, progress=progress)
            else:
                try:
                    result.raw[source_file.name] = download_file(
                        resolve_url(name, source_file, mirror), dest, source_file.checksum, source_file.algorithm,
                        retries=retries, backoff=backoff, progress=progress, session=session,
                        expected_size=source_file.size)
                except ChecksumMismatch as mismatch:
                    raise _naming_superseded(mismatch, source_file) from None
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
