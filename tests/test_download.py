"""Downloads against a local HTTP server that injects faults: every fault must end in a verified
file or a clear error, and nothing partial or corrupt may ever be marked complete.

The server (also used by test_real_manifests.py) serves `/<source>/<file>` with Range support and a
per-path queue of faults, each consumed by one request:
  "500"       HTTP 500, no body
  "truncate"  sends `cut` bytes of a body announced longer, then closes the connection cleanly
  "drop"      sends `cut` bytes, then resets the connection (RST) mid-body
  "wrong"     sends different bytes of the same length (checksum mismatch)
A path in `ignore_range` always answers 200 with the full body.
"""
from __future__ import annotations

import hashlib
import io
import re
import socket
import struct
import tarfile
import threading
import time
import zipfile
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hnclip.data.download import (
    ArchiveError,
    ChecksumMismatch,
    DownloadError,
    ManualStepRequired,
    OfflineError,
    download_dataset,
    download_file,
    extract_archive,
    marker_path,
    part_path,
    read_marker,
)
from hnclip.data.sources import MIRROR_ENV, Source, SourceFile, get_source, resolve_url

FAST = dict(backoff=0.001, progress=False)  # tiny backoff keeps the retry tests quick


# ---------------------------------------------------------------------------------------------
# The fault-injecting server
# ---------------------------------------------------------------------------------------------

@dataclass
class Served:
    path: str
    range: str | None
    status: int
    sent: int


@dataclass
class FaultServer:
    url: str = ""
    files: dict[str, bytes] = field(default_factory=dict)
    faults: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    ignore_range: set[str] = field(default_factory=set)
    cut: int = 1 << 19   # bytes sent before a truncation or drop (a multiple of the client's read size)
    log: list[Served] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, path: str, data: bytes, faults: list[str] = ()) -> str:
        """Serve `data` at `path` ('/<source>/<file>'); returns the full URL."""
        self.files[path] = data
        self.faults[path] = list(faults)
        return self.url + path

    def next_fault(self, path: str) -> str | None:
        with self.lock:
            queue = self.faults.get(path)
            return queue.pop(0) if queue else None

    def record(self, served: Served) -> None:
        with self.lock:
            self.log.append(served)

    def served(self, path: str) -> list[Served]:
        with self.lock:
            return [entry for entry in self.log if entry.path == path]


class FaultHandler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    @property
    def state(self) -> FaultServer:
        return self.server.state

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        requested_range = self.headers.get("Range")
        data = self.state.files.get(path)
        fault = self.state.next_fault(path)
        if data is None:
            return self._empty(path, requested_range, 404)
        if fault == "500":
            return self._empty(path, requested_range, 500)
        body = bytes(b ^ 0xFF for b in data) if fault == "wrong" else data
        start, status = 0, 200
        if requested_range and path not in self.state.ignore_range:
            start = int(re.match(r"bytes=(\d+)-", requested_range).group(1))
            if start >= len(body):
                return self._empty(path, requested_range, 416, {"Content-Range": f"bytes */{len(body)}"})
            status = 206
        payload = body[start:]
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.end_headers()
        interrupted = fault in ("truncate", "drop")
        sent = min(self.state.cut, len(payload) - 1) if interrupted else len(payload)
        self.state.record(Served(path, requested_range, status, sent))  # before the client can finish
        self.wfile.write(payload[:sent])
        if fault == "drop":
            time.sleep(0.2)  # let the client take what was sent, then reset the connection
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()

    def _empty(self, path: str, requested_range: str | None, status: int, headers: dict | None = None) -> None:
        self.state.record(Served(path, requested_range, status, 0))
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FaultHandler)
    httpd.state = FaultServer(url=f"http://127.0.0.1:{httpd.server_address[1]}")
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield httpd.state
    finally:
        httpd.shutdown()
        httpd.server_close()


def blob(size: int = 3 << 19, seed: int = 0) -> bytes:
    """Deterministic, incompressible-looking bytes."""
    out, counter = bytearray(), 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}-{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def assert_not_complete(dest: Path) -> None:
    assert not dest.exists()
    assert not marker_path(dest).exists()


# ---------------------------------------------------------------------------------------------
# download_file
# ---------------------------------------------------------------------------------------------

def test_download_verifies_renames_and_marks(server, tmp_path):
    data = blob()
    url = server.add("/src/file.bin", data)
    dest = download_file(url, tmp_path / "file.bin", sha256(data), **FAST)
    assert dest.read_bytes() == data
    assert not part_path(dest).exists()
    marker = read_marker(dest)
    assert marker["sha256"] == sha256(data) and marker["size"] == len(data)


def test_verified_file_is_not_downloaded_again(server, tmp_path):
    data = blob()
    url = server.add("/src/file.bin", data)
    download_file(url, tmp_path / "file.bin", sha256(data), **FAST)
    download_file(url, tmp_path / "file.bin", sha256(data), **FAST)
    assert len(server.served("/src/file.bin")) == 1


def test_tampered_file_is_fetched_again(server, tmp_path):
    data = blob()
    url = server.add("/src/file.bin", data)
    dest = download_file(url, tmp_path / "file.bin", sha256(data), **FAST)
    dest.write_bytes(b"tampered")  # size and mtime change: the marker no longer vouches for it
    download_file(url, dest, sha256(data), **FAST)
    assert dest.read_bytes() == data
    assert len(server.served("/src/file.bin")) == 2


def test_http_500_is_retried_until_success(server, tmp_path):
    data = blob()
    url = server.add("/src/file.bin", data, faults=["500", "500"])
    dest = download_file(url, tmp_path / "file.bin", sha256(data), retries=4, **FAST)
    assert dest.read_bytes() == data
    assert [s.status for s in server.served("/src/file.bin")] == [500, 500, 200]


def test_persistent_500_gives_up_with_a_clear_error(server, tmp_path):
    url = server.add("/src/file.bin", blob(), faults=["500"] * 10)
    dest = tmp_path / "file.bin"
    with pytest.raises(DownloadError, match=r"gave up .* after 3 attempt\(s\): HTTP 500") as error:
        download_file(url, dest, sha256(blob()), retries=2, **FAST)
    assert not isinstance(error.value, OfflineError)
    assert_not_complete(dest)


@pytest.mark.parametrize("fault", ["truncate", "drop"])
def test_interrupted_body_is_resumed_with_range(server, tmp_path, fault):
    data = blob()
    url = server.add("/src/file.bin", data, faults=[fault])
    dest = download_file(url, tmp_path / "file.bin", sha256(data), **FAST)
    assert dest.read_bytes() == data
    first, second = server.served("/src/file.bin")
    assert first.range is None and first.sent < len(data)
    assert second.range == f"bytes={first.sent}-" and second.status == 206
    assert second.sent == len(data) - first.sent < len(data)


def test_repeated_truncation_keeps_the_part_and_never_marks_complete(server, tmp_path):
    data = blob()
    server.cut = 1 << 18
    url = server.add("/src/file.bin", data, faults=["truncate"] * 10)
    dest = tmp_path / "file.bin"
    with pytest.raises(DownloadError, match="truncated|connection broken"):
        download_file(url, dest, sha256(data), retries=1, **FAST)
    assert_not_complete(dest)
    assert part_path(dest).stat().st_size == 2 * server.cut  # kept for the next run to resume
    server.faults["/src/file.bin"].clear()
    download_file(url, dest, sha256(data), **FAST)
    assert dest.read_bytes() == data
    assert server.served("/src/file.bin")[-1].range == f"bytes={2 * server.cut}-"


def test_server_ignoring_range_restarts_from_zero(server, tmp_path):
    data = blob()
    url = server.add("/src/file.bin", data, faults=["truncate"])
    server.ignore_range.add("/src/file.bin")
    dest = download_file(url, tmp_path / "file.bin", sha256(data), **FAST)
    assert dest.read_bytes() == data  # no duplicated prefix
    first, second = server.served("/src/file.bin")
    assert second.range == f"bytes={first.sent}-" and second.status == 200 and second.sent == len(data)


def test_existing_part_is_resumed(server, tmp_path):
    data = blob()
    url = server.add("/src/file.bin", data)
    dest = tmp_path / "file.bin"
    part_path(dest).write_bytes(data[:1000])
    download_file(url, dest, sha256(data), **FAST)
    assert dest.read_bytes() == data
    (served,) = server.served("/src/file.bin")
    assert served.range == "bytes=1000-" and served.sent == len(data) - 1000


def test_complete_part_answered_416_is_verified(server, tmp_path):
    data = blob(4096)
    url = server.add("/src/file.bin", data)
    dest = tmp_path / "file.bin"
    part_path(dest).write_bytes(data)
    download_file(url, dest, sha256(data), **FAST)
    assert dest.read_bytes() == data
    assert [s.status for s in server.served("/src/file.bin")] == [416]


def test_checksum_mismatch_deletes_the_part(server, tmp_path):
    data = blob()
    url = server.add("/src/file.bin", data, faults=["wrong"])
    dest = tmp_path / "file.bin"
    with pytest.raises(ChecksumMismatch) as error:
        download_file(url, dest, sha256(data), **FAST)
    got = sha256(bytes(b ^ 0xFF for b in data))
    assert f"expected {sha256(data)}" in str(error.value) and f"got {got}" in str(error.value)
    assert (error.value.expected, error.value.got) == (sha256(data), got)
    assert_not_complete(dest)
    assert not part_path(dest).exists()


def test_size_mismatch_is_a_checksum_error(server, tmp_path):
    data = blob(4096)
    url = server.add("/src/file.bin", data)
    dest = tmp_path / "file.bin"
    with pytest.raises(ChecksumMismatch, match="size is 4096 bytes, expected 4097"):
        download_file(url, dest, None, expected_size=4097, **FAST)
    assert_not_complete(dest)
    assert not part_path(dest).exists()


def test_md5_pins_and_unpinned_files_record_their_sha256(server, tmp_path):
    data = blob(4096)
    url = server.add("/src/file.bin", data)
    pinned = download_file(url, tmp_path / "a.bin", hashlib.md5(data).hexdigest(), algorithm="md5", **FAST)
    assert read_marker(pinned)["md5"] == hashlib.md5(data).hexdigest()
    unpinned = download_file(url, tmp_path / "b.bin", None, **FAST)
    assert read_marker(unpinned)["sha256"] == sha256(data) and read_marker(unpinned)["pinned"] is None


def test_offline_error_says_where_to_put_the_file(tmp_path):
    with socket.socket() as probe:  # a port nobody listens on: connection refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dest = tmp_path / "file.bin"
    with pytest.raises(OfflineError) as error:
        download_file(f"http://127.0.0.1:{port}/src/file.bin", dest, "ab" * 32, retries=1, **FAST)
    assert "offline" in str(error.value) and str(dest) in str(error.value)
    assert_not_complete(dest)


def test_http_404_is_not_retried(server, tmp_path):
    dest = tmp_path / "file.bin"
    with pytest.raises(DownloadError, match="HTTP 404"):
        download_file(server.url + "/src/missing.bin", dest, None, **FAST)
    assert len(server.served("/src/missing.bin")) == 1
    assert_not_complete(dest)


# ---------------------------------------------------------------------------------------------
# Archives and whole sources
# ---------------------------------------------------------------------------------------------

def tar_gz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for name, data in members.items():
            bundle.writestr(name, data)
    return buffer.getvalue()


def toy_source(checksum: str | None) -> Source:
    return Source(name="toy", title="toy", homepage="", license="",
                  files=(SourceFile(name="data.tar.gz", url=None, checksum=checksum),))


@pytest.mark.parametrize("pinned", [False, True])
def test_corrupt_archive_is_never_marked_complete(server, tmp_path, pinned):
    good = tar_gz({"data/a.txt": blob(200_000, 1), "data/b.txt": b"b"})
    corrupt = good[: len(good) // 2]
    server.add("/toy/data.tar.gz", corrupt)
    source = toy_source(sha256(corrupt) if pinned else None)
    with pytest.raises(ArchiveError, match="corrupt or incomplete"):
        download_dataset("toy", tmp_path, server.url, source=source, **FAST)
    raw, extracted = tmp_path / "toy" / "raw" / "data.tar.gz", tmp_path / "toy" / "extracted"
    assert not marker_path(raw).exists()
    assert raw.exists() == pinned  # an unpinned corrupt archive is deleted, so the next run refetches
    assert not (extracted / ".complete").exists()
    assert [p for p in extracted.rglob("*") if p.is_file()] == []

    server.add("/toy/data.tar.gz", good)
    raw.unlink(missing_ok=True)
    download_dataset("toy", tmp_path, server.url, source=toy_source(sha256(good)), **FAST)
    assert (extracted / "data" / "b.txt").read_bytes() == b"b"
    assert (extracted / ".complete" / "data.tar.gz.json").is_file()


@pytest.mark.parametrize("kind", ["tar", "zip"])
@pytest.mark.parametrize("evil", ["../escape.txt", "/tmp/hnclip-absolute.txt", "ok/../../escape.txt"])
def test_path_traversal_is_refused(tmp_path, kind, evil):
    members = {"fine.txt": b"fine", evil: b"evil"}
    archive = tmp_path / ("a.tar.gz" if kind == "tar" else "a.zip")
    archive.write_bytes(tar_gz(members) if kind == "tar" else zip_bytes(members))
    extracted = tmp_path / "out" / "extracted"
    with pytest.raises(ArchiveError, match="unsafe member path"):
        extract_archive(archive, extracted)
    assert not (tmp_path / "out" / "escape.txt").exists() and not (tmp_path / "escape.txt").exists()
    assert not (extracted / "fine.txt").exists()
    assert not (extracted / ".complete").exists()


def test_extraction_is_skipped_when_already_done(tmp_path):
    archive = tmp_path / "a.zip"
    archive.write_bytes(zip_bytes({"d/x.txt": b"x"}))
    extract_archive(archive, tmp_path / "ex")
    (tmp_path / "ex" / "d" / "x.txt").write_bytes(b"edited")
    extract_archive(archive, tmp_path / "ex")
    assert (tmp_path / "ex" / "d" / "x.txt").read_bytes() == b"edited"


def test_manual_file_prints_instructions(server, tmp_path, capsys):
    source = Source(name="toy", title="toy", homepage="", license="", files=(
        SourceFile(name="auto.bin", url=None),
        SourceFile(name="gated.tar", url=None, manual=True, instructions="Accept the licence at example.org.",
                   satisfied_by="photos", extract_to="photos"),
    ))
    server.add("/toy/auto.bin", b"auto")
    with pytest.raises(ManualStepRequired) as error:
        download_dataset("toy", tmp_path, server.url, source=source, **FAST)
    message = str(error.value)
    for needle in ("gated.tar", "Accept the licence at example.org.", str(tmp_path / "toy" / "raw" / "gated.tar"),
                   str(tmp_path / "toy" / "extracted" / "photos")):
        assert needle in message
    assert message in capsys.readouterr().err
    assert read_marker(tmp_path / "toy" / "raw" / "auto.bin")  # the automatic part was still done

    result = download_dataset("toy", tmp_path, server.url, source=source, require_manual=False, **FAST)
    assert result.pending_manual == [message]


def test_longclip_weights_come_through_the_mirror(server, tmp_path, monkeypatch):
    weights = blob(4096, 7)
    server.add("/longclip_l/longclip-L.pt", weights)
    source = get_source("longclip_l").with_files({"longclip-L.pt": {"checksum": sha256(weights)}})
    monkeypatch.setenv(MIRROR_ENV, server.url + "/")
    result = download_dataset("longclip_l", tmp_path, source=source, **FAST)
    assert result.raw["longclip-L.pt"].read_bytes() == weights


def test_mirror_resolution(monkeypatch):
    weights = get_source("longclip_l").file("longclip-L.pt")
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    assert resolve_url("longclip_l", weights) == weights.url
    assert resolve_url("longclip_l", weights, "http://m/") == "http://m/longclip_l/longclip-L.pt"
    monkeypatch.setenv(MIRROR_ENV, "http://env")
    assert resolve_url("longclip_l", weights) == "http://env/longclip_l/longclip-L.pt"


def test_source_table_is_complete():
    for name in ("docci", "dci", "urban1k", "vg_paragraphs", "longclip_l"):
        source = get_source(name)
        assert source.license and source.files
        for source_file in source.files:
            assert source_file.manual == (source_file.url is None)
            assert source_file.checksum is not None or "pin on first verified download" in source_file.note
            assert not source_file.manual or source_file.instructions
    assert get_source("longclip_l").file("longclip-L.pt").checksum == \
        "60c077e512cd95ca9fe7b13285e4e2c99073f8d6df7113eb6d2979919db397b2"
    assert get_source("dci").file("sa_000138.tar").manual
