"""What a download leaves on record: every file's sha256, and whether it was checked against a pin
or, for a file no public source gives a checksum for, recorded on its first verified download. Both
`download.json` and `hnclip lineage` show it in full."""
from __future__ import annotations

import json

import pytest
from helpers.fault_server import FAST
from helpers.payloads import blob, sha256

from hnclip.commands.download import download_source
from hnclip.config.registry import Registry
from hnclip.data.download import download_dataset
from hnclip.data.sources import SOURCES, UNPINNED, Source, SourceFile
from hnclip.io import read_json, write_json
from hnclip.provenance.lineage import _manifest_node, format_lineage

PINNED, UNPINNED_DATA = blob(4096, seed=3), b'[1, 2, 3]'


def toy_source() -> Source:
    return Source(name="toy", title="toy", homepage="", license="CC0", files=(
        SourceFile(name="weights.bin", url="https://example.org/weights.bin", checksum=sha256(PINNED),
                   size=len(PINNED)),
        SourceFile(name="split.json", url="https://example.org/split.json", note=UNPINNED),
    ))


@pytest.fixture
def served(server, monkeypatch):
    server.add("/toy/weights.bin", PINNED)
    server.add("/toy/split.json", UNPINNED_DATA)
    monkeypatch.setitem(SOURCES, "toy", toy_source())
    return server


def test_download_record_gives_each_files_sha256_and_whether_a_pin_checked_it(served, params, tmp_path,
                                                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    registry = Registry(params, profile="paper", validate=False)
    raw = download_source(registry, "toy", mirror=served.url)
    record = read_json(raw.parent / "download.json")
    assert record["files"]["split.json"] == {
        "sha256": sha256(UNPINNED_DATA), "size": len(UNPINNED_DATA), "algorithm": "sha256", "pinned": None,
        "url": f"{served.url}/toy/split.json", "checked": "recorded on first verified download (no pin)"}
    weights = record["files"]["weights.bin"]
    assert (weights["sha256"], weights["pinned"], weights["checked"]) == \
        (sha256(PINNED), sha256(PINNED), "against the pin")
    assert record["inputs"]["raw:split.json"]["sha256"] == sha256(UNPINNED_DATA)


def test_lineage_prints_every_downloaded_files_full_sha256(served, tmp_path):
    data_root = tmp_path / "data" / "real"
    download_dataset("toy", data_root, served.url, source=toy_source(), **FAST)
    manifest = data_root / "toyset" / "train.jsonl"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"id": "1", "caption": "c", "source_sha256": sha256(UNPINNED_DATA)}) + "\n")
    write_json(manifest.parent / "dataset.json", {
        "kind": "dataset", "spec": {"kind": "real", "source": "toy"},
        "inputs": {}, "counts": {"train": 1}})
    node = _manifest_node(tmp_path, "train manifest", {"path": "data/real/toyset/train.jsonl"})
    text = format_lineage(node)
    assert f"downloaded split.json: sha256 {sha256(UNPINNED_DATA)} (recorded on first verified download, " \
           f"no pin)" in text
    assert f"downloaded weights.bin: sha256 {sha256(PINNED)} (checked against the pin)" in text
    raw_node = node["inputs"][0]["inputs"][0]
    assert raw_node["facts"]["download_markers"]["split.json"]["sha256"] == sha256(UNPINNED_DATA)
