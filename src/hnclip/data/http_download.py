"""One file over plain HTTP: resumable, retried, verified and atomic.

A file is fetched into `<dest>.part`, resuming with an HTTP Range request from the bytes already
there, and only a .part whose hash matches is moved onto `<dest>` and marked (verified_files.py). Each
request retries connection failures and HTTP 429/5xx answers itself (urllib3 `Retry`: exponential
backoff, Retry-After honoured); a body that breaks off mid-way is resumed from the .part. Everything
else fails at once with a `DownloadError` that says what to do.
"""
from __future__ import annotations

import logging
import os
import re
import socket
from pathlib import Path

import requests
import urllib3.exceptions
from requests.adapters import HTTPAdapter
from tqdm import tqdm
from urllib3.util import Retry

from hnclip.data.download_errors import DownloadError, OfflineError, describe, offline_message
from hnclip.data.sources import MIRROR_ENV
from hnclip.data.verified_files import check_algorithm, commit_verified, verify_existing

log = logging.getLogger(__name__)

STREAM_CHUNK = 1 << 18   # network reads: a dropped connection loses at most the chunk in flight
RETRY_STATUSES = frozenset({429, *range(500, 600)})  # answers worth asking again; any other error is final


class _Interrupted(Exception):
    """A response whose body broke off (or answered the wrong byte range): resume from the .part."""


def part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


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
    check_algorithm(algorithm)
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
    commit_verified(part, dest, expected_hash, algorithm, expected_size, url)
    return dest


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
                raise OfflineError(offline_message(url, describe(error), dest, algorithm, expected_hash)) from error
            raise DownloadError(f"gave up on {url} after {retries + 1} attempt(s): {describe(error)}. "
                                f"Rerunning resumes from the bytes kept in {part}.") from error


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
            raise _Interrupted(f"connection broken after {offset + received} bytes ({describe(error)})") from error
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
