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
from helpers.payloads import blob, sha256, tar_bytes, tar_gz, zip_bytes

from hnclip.data.archives import extract_archive
from hnclip.data.download import download_dataset
from hnclip.data.download_errors import (
    ArchiveError,
    ChecksumMismatch,
    DownloadError,
    ManualStepRequired,
    OfflineError,
)
from hnclip.data.http_download import download_file, part_path
from hnclip.data.hub_download import download_hub_file
from hnclip.data.sources import (
    LONGCLIP_L_FIRST_UPLOAD,
    LONGCLIP_L_REVISION,
    MIRROR_ENV,
    SOURCES,
    Source,
    SourceFile,
    Superseded,
    get_source,
    resolve_url,
)
from hnclip.data.verified_files import marker_path, read_marker

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


def longclip_pinned_to(data: bytes, first_upload: bytes | None = None) -> Source:
    """The real Long-CLIP-L entry (repo, commit, URL, texts), its pins swapped for those of small
    stand-ins: `data` for the current release, `first_upload` for the superseded one."""
    pins: dict = {"checksum": sha256(data), "size": len(data)}
    if first_upload is not None:
        pins["supersedes"] = (Superseded(sha256(first_upload), len(first_upload), LONGCLIP_L_FIRST_UPLOAD.what),)
    return get_source("longclip_l").with_files({"longclip-L.pt": pins})


def test_longclip_current_release_is_fetched_at_its_pinned_commit(hub, tmp_path):
    data = blob(4096)
    path = hub.add_hub("BeichenZhang/LongCLIP-L", LONGCLIP_L_REVISION, "longclip-L.pt", data)
    result = download_dataset("longclip_l", tmp_path, source=longclip_pinned_to(data), **FAST)
    assert result.raw["longclip-L.pt"].read_bytes() == data
    assert read_marker(result.raw["longclip-L.pt"])["sha256"] == sha256(data)
    assert [s.status for s in hub.served(path)] == [200]  # asked for at a29856989d..., not at main


@pytest.mark.parametrize("via", ["hub", "mirror"])
def test_superseded_longclip_upload_is_refused_naming_the_current_release(hub, tmp_path, via):
    current, first_upload = blob(4096), blob(4000, seed=1)
    hub.add_hub("BeichenZhang/LongCLIP-L", LONGCLIP_L_REVISION, "longclip-L.pt", first_upload)
    hub.add("/mirror/longclip_l/longclip-L.pt", first_upload)
    mirror = hub.url + "/mirror" if via == "mirror" else None
    with pytest.raises(ChecksumMismatch) as error:
        download_dataset("longclip_l", tmp_path, mirror, source=longclip_pinned_to(current, first_upload), **FAST)
    message = str(error.value)
    assert "first upload of Long-CLIP-L, from before the DDP fix" in message
    assert f"sha256 {sha256(current)}" in message
    assert f"https://huggingface.co/BeichenZhang/LongCLIP-L/resolve/{LONGCLIP_L_REVISION}/longclip-L.pt" in message
    assert "92e2948" not in message and "60c077e5" not in message  # never points back to it
    assert_not_complete(tmp_path / "longclip_l" / "raw" / "longclip-L.pt")


def test_an_unrelated_wrong_file_is_not_called_the_superseded_upload(hub, tmp_path):
    current, other = blob(4096), blob(3000, seed=2)
    hub.add_hub("BeichenZhang/LongCLIP-L", LONGCLIP_L_REVISION, "longclip-L.pt", other)
    with pytest.raises(ChecksumMismatch) as error:
        download_dataset("longclip_l", tmp_path, source=longclip_pinned_to(current, blob(4000, seed=1)), **FAST)
    assert "first upload" not in str(error.value)


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
    script = (f"from hnclip.data.hub_download import download_hub_file\n"
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


def _same_size_impostor(kind: str) -> tuple[bytes, bytes]:
    """A pinned archive and a valid archive of the same size with other content (only the pin can tell)."""
    build = {"tar": tar_bytes, "zip": zip_bytes}[kind]
    good, impostor = (build({"data/a.txt": blob(4096, seed), "data/b.txt": b"b"}) for seed in (1, 2))
    assert len(good) == len(impostor) and good != impostor
    return good, impostor


@pytest.mark.parametrize("algorithm", ["sha256", "md5"])   # DOCCI's image archive is md5-pinned
@pytest.mark.parametrize("kind", ["tar", "zip"])
@pytest.mark.parametrize("via", ["argument", "environment"])
def test_mirror_serving_the_right_size_but_wrong_content_fails_the_checksum(server, tmp_path, monkeypatch,
                                                                            algorithm, kind, via):
    good, impostor = _same_size_impostor(kind)
    name = f"data.{kind}"
    pin = getattr(hashlib, algorithm)(good).hexdigest()
    source = Source(name="toy", title="toy", homepage="", license="", files=(
        SourceFile(name=name, url="https://example.invalid/never-asked", checksum=pin, algorithm=algorithm,
                   size=len(good)),))
    server.add(f"/mirror/toy/{name}", impostor)
    mirror = server.url + "/mirror"
    if via == "environment":
        monkeypatch.setenv(MIRROR_ENV, mirror)
        mirror = None
    else:
        monkeypatch.delenv(MIRROR_ENV, raising=False)
    with pytest.raises(ChecksumMismatch, match=f"{algorithm} mismatch: expected {pin}") as error:
        download_dataset("toy", tmp_path, mirror, source=source, **FAST)
    assert error.value.got == getattr(hashlib, algorithm)(impostor).hexdigest()
    raw = tmp_path / "toy" / "raw" / name
    assert_not_complete(raw)
    assert not part_path(raw).exists()                       # a wrong body is never resumed from
    assert not (tmp_path / "toy" / "extracted").exists()     # nor unpacked
    assert len(server.served(f"/mirror/toy/{name}")) == 1    # the mirror was asked, not the original host

    server.add(f"/mirror/toy/{name}", good)                  # the mirror repaired: the same call now succeeds
    download_dataset("toy", tmp_path, mirror, source=source, **FAST)
    assert raw.read_bytes() == good and (tmp_path / "toy" / "extracted" / "data" / "b.txt").read_bytes() == b"b"


def test_mirror_serving_a_hub_file_with_the_wrong_content_fails_the_checksum(hub, tmp_path):
    """A mirror replaces the Hub for a Hub-hosted file; the file's pin still applies."""
    current, impostor = blob(4096, 1), blob(4096, 2)
    hub.add("/mirror/longclip_l/longclip-L.pt", impostor)
    with pytest.raises(ChecksumMismatch, match=f"sha256 mismatch: expected {sha256(current)}"):
        download_dataset("longclip_l", tmp_path, hub.url + "/mirror", source=longclip_pinned_to(current), **FAST)
    assert_not_complete(tmp_path / "longclip_l" / "raw" / "longclip-L.pt")
    assert {entry.path for entry in hub.log} == {"/mirror/longclip_l/longclip-L.pt"}  # the Hub was not asked


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
    source = longclip_pinned_to(weights)
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
    assert set(SOURCES) == {"docci", "dci", "urban1k", "vg_paragraphs", "longclip_l", "sam_vit_huge",
                            "clip_vit_l14_336"}
    for name in SOURCES:
        source = get_source(name)
        assert source.license and source.files
        for source_file in source.files:
            assert source_file.manual == (source_file.url is None)
            assert source_file.checksum is not None or "pin on first verified download" in source_file.note
            assert not source_file.manual or source_file.instructions
            # every Hugging Face file goes through hf_hub_download
            assert bool(source_file.hub_repo) == ("huggingface.co/" in (source_file.url or ""))
            # ... and every one is pinned to a full commit, which its URL names
            assert not source_file.hub_repo or (re.fullmatch(r"[0-9a-f]{40}", source_file.revision)
                                                and f"/resolve/{source_file.revision}/" in source_file.url)
    assert get_source("dci").file("sa_000138.tar").manual
    assert get_source("urban1k").file("Urban1k.zip").revision == "953fcf1d1a3bde031d9424a91a0154e594b5a586"


# The pins as their public pages give them (sources.py names each page next to its pin).
PINS = {
    ("longclip_l", "longclip-L.pt"): ("a29856989d49817508dbda0fb95c7f6ffc314331",
                                      "9d2c12ffcbf9099f95bfb9cf8f08f949b695e22fb0018e8895e088f4a88b6afd",
                                      1_711_923_133),
    ("sam_vit_huge", "model.safetensors"): ("87aecf0df4ce6b30cd7de76e87673c49644bdf67",
                                            "edfb0462392541fca9af44ff039bfb32dbd0c939997f3abb77a26e23af7afd7c", None),
    ("clip_vit_l14_336", "pytorch_model.bin"): ("ce19dc912ca5cd21c8a653c79e251e808ccabcd1",
                                                "c6032c2e0caae3dc2d4fba35535fa6307dbb49df59c7e182b1bc4b3329b81801",
                                                1_711_974_081),
    ("docci", "docci_test.json"): ("34f018e820e204ee06f9c7f56b173526ab07cb8a",
                                   "13280acd7a17da3956e77bf761f8f202a990964fcf73dfeb2eae459d85045ca3", 3_883_735),
    ("dci", "DCI_test.json"): ("eee0686420aae054d6d79e2289369e99c114ddf4",
                               "35227d8dfe02eccfff44947ecd0c265fb20ce3c03a59c85f062356b7c15165ae", 1_704_117),
    ("dci", "DCI_segment_only_sim_max_del_org.json"): (
        "34f018e820e204ee06f9c7f56b173526ab07cb8a",
        "40affe13d27ed8dd3dfd255659338b7712ad0b5034ee9cef7632bfd076276b97", 2_473_521),
}


@pytest.mark.parametrize("source, name", list(PINS))
def test_pins_are_those_of_the_public_pages(source, name):
    revision, checksum, size = PINS[source, name]
    source_file = get_source(source).file(name)
    assert (source_file.revision, source_file.checksum, source_file.algorithm, source_file.size) == \
        (revision, checksum, "sha256", size)
    assert revision in source_file.url


def test_longclip_l_knows_its_superseded_first_upload_without_pointing_back_to_it():
    weights = get_source("longclip_l").file("longclip-L.pt")
    first_upload, = weights.supersedes
    assert (first_upload.sha256, first_upload.size) == (
        "60c077e512cd95ca9fe7b13285e4e2c99073f8d6df7113eb6d2979919db397b2", 1_711_920_771)  # HF commit 92e2948
    assert weights.superseded_by_this(first_upload.sha256) is first_upload
    assert weights.superseded_by_this(first_upload.size) is first_upload
    assert weights.superseded_by_this(weights.checksum) is None and weights.superseded_by_this(None) is None
    assert "92e2948" not in first_upload.what and "60c077e5" not in first_upload.what


def test_hub_model_folders_hold_the_files_the_loaders_read():
    clip = [f.name for f in get_source("clip_vit_l14_336").files]
    assert "pytorch_model.bin" in clip and "model.safetensors" not in clip  # the repo has no safetensors
    assert {"config.json", "preprocessor_config.json", "tokenizer.json", "vocab.json", "merges.txt"} <= set(clip)
    sam = [f.name for f in get_source("sam_vit_huge").files]
    assert sorted(sam) == ["config.json", "model.safetensors", "preprocessor_config.json"]


def test_vg_paragraphs_come_zipped_from_visual_genomes_dataset_folder():
    source = get_source("vg_paragraphs")
    paragraphs = source.file("paragraphs_v1.json.zip")
    assert paragraphs.url == "https://visualgenome.org/static/data/dataset/paragraphs_v1.json.zip"
    assert paragraphs.is_archive and paragraphs.extract_only == "paragraphs_v1.json" and paragraphs.flatten
    assert paragraphs.checksum is None and "pin on first verified download" in paragraphs.note
    assert all(f.url.startswith("https://cs.stanford.edu/people/ranjaykrishna/im2p/")
               for f in source.files if f.name.endswith("_split.json"))
