"""Downloads against a local HTTP server that injects faults: every fault must end in a verified
file or a clear error, and nothing partial or corrupt may ever be marked complete.

The fault-injecting server and its fault kinds are described in tests/helpers/fault_server.py.
"""
from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import urllib3.util.retry
from helpers.fault_server import FAST
from helpers.payloads import blob, sha256, tar_gz, zip_bytes

from hnclip.data.download import (
    ArchiveError,
    ChecksumMismatch,
    DownloadError,
    ManualStepRequired,
    OfflineError,
    download_dataset,
    download_file,
    download_hub_file,
    extract_archive,
    marker_path,
    part_path,
    read_marker,
)
from hnclip.data.sources import MIRROR_ENV, Source, SourceFile, get_source, resolve_url

# ---------------------------------------------------------------------------------------------
# The fault-injecting server
# ---------------------------------------------------------------------------------------------

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


def test_429_waits_as_long_as_retry_after_says(server, tmp_path, monkeypatch):
    slept = []
    monkeypatch.setattr(urllib3.util.retry.time, "sleep", slept.append)  # record the wait instead of waiting
    data = blob(4096)
    url = server.add("/src/file.bin", data, faults=["429"])
    dest = download_file(url, tmp_path / "file.bin", sha256(data), **FAST)
    assert dest.read_bytes() == data
    assert [s.status for s in server.served("/src/file.bin")] == [429, 200]
    assert slept == [3]  # the server's Retry-After, not the (tiny) backoff


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
# Hugging Face Hub files
# ---------------------------------------------------------------------------------------------

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub(server, tmp_path, monkeypatch):
    """huggingface_hub pointed at the fault server. It reads HF_ENDPOINT (and HF_HUB_CACHE) once, at
    import, into these constants: set them as that import would have (the subprocess test sets the
    variable itself)."""
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "ENDPOINT", server.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        server.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    return server


def hub_file(data: bytes | None, revision: str | None = COMMIT, name: str = "weights.bin") -> SourceFile:
    return SourceFile(name=name, url=None, checksum=sha256(data) if data is not None else None,
                      hub_repo="org/toy-data", hub_repo_type="dataset", revision=revision)


def test_hub_file_is_fetched_at_its_pinned_commit_verified_and_marked(hub, tmp_path):
    data = blob()
    path = hub.add_hub("org/toy-data", COMMIT, "weights.bin", data, repo_type="dataset")
    source = Source(name="toy", title="toy", homepage="", license="", files=(hub_file(data),))
    raw = tmp_path / "toy" / "raw"
    result = download_dataset("toy", tmp_path, source=source, **FAST)
    assert result.raw["weights.bin"] == raw / "weights.bin" and (raw / "weights.bin").read_bytes() == data
    marker = read_marker(raw / "weights.bin")
    assert marker["sha256"] == sha256(data) and marker["url"] == hub.url + path
    assert [s.status for s in hub.served(path, "HEAD")] == [200] and [s.status for s in hub.served(path)] == [200]
    assert sorted(p.name for p in raw.iterdir()) == ["weights.bin", "weights.bin.complete"]  # no staging left
    download_dataset("toy", tmp_path, source=source, **FAST)
    assert len(hub.served(path, "HEAD")) == 1 and len(hub.served(path)) == 1  # verified: not asked again


def test_hub_checksum_mismatch_is_never_marked_complete(hub, tmp_path):
    data = blob(4096)
    hub.add_hub("org/toy-data", COMMIT, "weights.bin", data, faults=["wrong"], repo_type="dataset")
    dest = tmp_path / "raw" / "weights.bin"
    with pytest.raises(ChecksumMismatch, match=f"expected {sha256(data)}"):
        download_hub_file(hub_file(data), dest, progress=False)
    assert_not_complete(dest)
    assert list(dest.parent.iterdir()) == []


def test_hub_body_broken_midway_is_resumed_by_the_library(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1 << 18)  # it keeps whole chunks only (10 MB by default)
    data = blob()
    path = hub.add_hub("org/toy-data", COMMIT, "weights.bin", data, faults=["truncate"], repo_type="dataset")
    dest = download_hub_file(hub_file(data), tmp_path / "weights.bin", progress=False)
    assert dest.read_bytes() == data
    first, second = hub.served(path)
    assert first.range is None and second.range == f"bytes={first.sent}-" and second.status == 206


@pytest.mark.parametrize("revision", [None, "main", "0123abc"])
def test_hub_file_without_a_full_commit_is_refused(hub, tmp_path, revision):
    data = blob(4096)
    hub.add_hub("org/toy-data", "main", "weights.bin", data, repo_type="dataset")
    dest = tmp_path / "weights.bin"
    with pytest.raises(DownloadError) as error:
        download_hub_file(hub_file(data, revision), dest, progress=False)
    message = str(error.value)
    for needle in (f"revision={revision!r}", "https://huggingface.co/datasets/org/toy-data/commits/main",
                   f"sha256 {sha256(data)}", "hnclip/data/sources.py", MIRROR_ENV, str(dest)):
        assert needle in message
    assert hub.log == []  # nothing was asked of the Hub
    assert_not_complete(dest)


def test_longclip_weights_ask_for_their_commit_to_be_pinned(hub, tmp_path):
    weights = get_source("longclip_l").file("longclip-L.pt")
    with pytest.raises(DownloadError, match=r"BeichenZhang/LongCLIP-L/commits/main .*sha256 60c077e5"):
        download_dataset("longclip_l", tmp_path, **FAST)
    assert weights.hub_repo == "BeichenZhang/LongCLIP-L" and hub.log == []


def test_hub_file_placed_by_hand_needs_no_commit(hub, tmp_path):
    data = blob(4096)
    dest = tmp_path / "weights.bin"
    dest.write_bytes(data)
    assert download_hub_file(hub_file(data, revision=None), dest, progress=False) == dest
    assert read_marker(dest)["sha256"] == sha256(data) and hub.log == []


def test_hub_offline_says_where_to_put_the_file(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    dest = tmp_path / "weights.bin"
    with pytest.raises(OfflineError) as error:
        download_hub_file(hub_file(blob(4096)), dest, progress=False)
    assert "offline" in str(error.value) and str(dest) in str(error.value)
    assert_not_complete(dest)


def test_hub_missing_file_is_a_clear_error(hub, tmp_path):
    dest = tmp_path / "weights.bin"
    with pytest.raises(DownloadError, match="Check hub_repo and revision") as error:
        download_hub_file(hub_file(blob(4096)), dest, progress=False)
    assert not isinstance(error.value, OfflineError)
    assert_not_complete(dest)


def test_hf_endpoint_points_the_hub_download_elsewhere(server, tmp_path):
    data = blob(4096)
    path = server.add_hub("org/toy-data", COMMIT, "weights.bin", data, repo_type="dataset")
    dest = tmp_path / "weights.bin"
    script = (f"from hnclip.data.download import download_hub_file\n"
              f"from hnclip.data.sources import SourceFile\n"
              f"download_hub_file(SourceFile(name='weights.bin', url=None, checksum={sha256(data)!r}, "
              f"hub_repo='org/toy-data', hub_repo_type='dataset', revision={COMMIT!r}), {str(dest)!r}, progress=False)")
    env = {**os.environ, "HF_ENDPOINT": server.url, "HF_HUB_CACHE": str(tmp_path / "hf-cache")}
    env.pop(MIRROR_ENV, None)
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    assert dest.read_bytes() == data and read_marker(dest)["url"] == server.url + path


# ---------------------------------------------------------------------------------------------
# Archives and whole sources
# ---------------------------------------------------------------------------------------------

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
            # every Hugging Face file goes through hf_hub_download, pinned to a full commit or not at all
            assert bool(source_file.hub_repo) == ("huggingface.co/" in (source_file.url or ""))
            assert not source_file.hub_repo or source_file.revision is None \
                or re.fullmatch(r"[0-9a-f]{40}", source_file.revision)
    assert get_source("longclip_l").file("longclip-L.pt").checksum == \
        "60c077e512cd95ca9fe7b13285e4e2c99073f8d6df7113eb6d2979919db397b2"
    assert get_source("dci").file("sa_000138.tar").manual
    assert get_source("urban1k").file("Urban1k.zip").revision == "953fcf1d1a3bde031d9424a91a0154e594b5a586"
