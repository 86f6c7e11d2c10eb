"""Resumable, sharded auxiliary builds (hnclip.auxiliary.shards): a build killed between shards
keeps its finished shards untouched, a rerun skips them and writes an index byte-identical to an
uninterrupted run's, and a shard made from other inputs is never reused."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers.auxiliary import Counting, CountingSegmenter, colour_encoders, write_scenes, write_synthetic

from hnclip.auxiliary import edges as edges_module
from hnclip.auxiliary.edges import EdgeSettings, build_edges
from hnclip.auxiliary.lism import LismSettings, build_lism
from hnclip.auxiliary.segments import CpuSegmenter
from hnclip.auxiliary.shards import EXIT_AFTER_ENV, EXIT_CODE, build_sharded, shard_count, shard_path
from hnclip.config.paths import shard_dir
from hnclip.errors import UserError
from hnclip.hashing import file_sha256
from hnclip.io import write_jsonl
from hnclip.rehearsal.miniature_models import clip_bpe, save_tiny_clip, save_tiny_sam
from hnclip.rehearsal.mirror import SAM_IMAGE_SIZE

TESTS = Path(__file__).resolve().parent


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `folder`: its bytes and mtime."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


# --- the helper on its own ------------------------------------------------------------------

ITEMS = [SimpleNamespace(id=f"item-{i}", value=i) for i in range(10)]


class Rows:
    """make_rows: records the batches it is given and fails on an item if asked."""

    def __init__(self, fail_on: int | None = None, scale: float = 0.1):
        self.batches, self.fail_on, self.scale = [], fail_on, scale

    def __call__(self, batch):
        self.batches.append([item.value for item in batch])
        if self.fail_on in self.batches[-1]:
            raise RuntimeError("killed")
        return [{"id": item.id, "value": item.value * self.scale, "nested": {"b": [1, 2], "a": None}}
                for item in batch]


def test_rows_go_to_shards_of_fixed_blocks_and_the_output_is_assembled_from_them(tmp_path):
    out = tmp_path / "index.jsonl"
    make = Rows()
    rows, counts = build_sharded(ITEMS, make, out, {"manifest_sha256": "a"}, shard_items=4, batch_items=3)
    assert make.batches == [[0, 1, 2], [3], [4, 5, 6], [7], [8, 9]]   # batches never cross a shard
    reference = tmp_path / "reference.jsonl"
    write_jsonl(reference, Rows()(ITEMS))
    assert out.read_bytes() == reference.read_bytes() and rows == Rows()(ITEMS)
    assert counts == {"shards": 3, "shards_reused": 0, "shard_items": 4}
    assert not shard_dir(out).exists() and shard_dir(out) == tmp_path / "index.jsonl.shards"


def test_a_killed_build_resumes_from_its_untouched_shards(tmp_path):
    out, identity = tmp_path / "index.jsonl", {"manifest_sha256": "a", "fingerprint": {"model": "m"}}
    with pytest.raises(RuntimeError, match="killed"):
        build_sharded(ITEMS, Rows(fail_on=5), out, identity, shard_items=4)
    assert not out.exists()
    area = shard_dir(out)
    assert sorted(p.name for p in area.iterdir()) == ["shard-00000.jsonl"]   # no partial shard, no temp file
    header = json.loads(shard_path(area, 0).read_text().splitlines()[0])["shard"]
    assert header == {"format": 1, "identity": identity, "index": 0, "first": 0, "stop": 4,
                      "first_id": "item-0", "last_id": "item-3"}
    first = _snapshot(area)

    second = Rows(fail_on=9)
    with pytest.raises(RuntimeError, match="killed"):
        build_sharded(ITEMS, second, out, identity, shard_items=4)
    assert second.batches[0] == [4]                                   # shard 0 was skipped
    after = _snapshot(area)
    assert after["shard-00000.jsonl"] == first["shard-00000.jsonl"]   # same bytes, same mtime
    assert set(after) == {"shard-00000.jsonl", "shard-00001.jsonl"}

    third = Rows()
    _, counts = build_sharded(ITEMS, third, out, identity, shard_items=4)
    assert third.batches == [[8], [9]] and counts["shards_reused"] == 2
    build_sharded(ITEMS, Rows(), tmp_path / "uninterrupted.jsonl", identity, shard_items=4)
    assert out.read_bytes() == (tmp_path / "uninterrupted.jsonl").read_bytes()
    assert not area.exists()


@pytest.mark.parametrize("change", ["manifest", "fingerprint", "block size"])
def test_a_shard_made_from_other_inputs_is_made_again(tmp_path, change, caplog):
    out, identity = tmp_path / "index.jsonl", {"manifest_sha256": "a", "fingerprint": "f"}
    with pytest.raises(RuntimeError):
        build_sharded(ITEMS, Rows(fail_on=5, scale=0.5), out, identity, shard_items=4)
    other = {"manifest": {**identity, "manifest_sha256": "b"}, "fingerprint": {**identity, "fingerprint": "g"},
             "block size": identity}[change]
    make = Rows()
    _, counts = build_sharded(ITEMS, make, out, other, shard_items=3 if change == "block size" else 4)
    assert counts["shards_reused"] == 0 and sum(make.batches, []) == list(range(10))
    assert out.read_bytes() == b"".join(json.dumps(r, sort_keys=True).encode() + b"\n" for r in Rows()(ITEMS))
    expected = {"manifest": "identity differ", "fingerprint": "identity differ",
                "block size": "last_id, stop differ"}[change]
    assert f"made again (made from other inputs or another block ({expected}))" in caplog.text


def test_a_shard_whose_files_are_gone_is_made_again(tmp_path):
    out, made = tmp_path / "index.jsonl", []

    def make_rows(batch):
        for item in batch:
            if item.value == 5 and not made:
                made.append("killed")
                raise RuntimeError("killed")
            (tmp_path / f"{item.id}.bin").write_text(item.id)
        return [{"id": item.id, "file": f"{item.id}.bin"} for item in batch]

    with pytest.raises(RuntimeError):
        build_sharded(ITEMS, make_rows, out, {}, shard_items=4, files_of=lambda row: [row["file"]])
    (tmp_path / "item-2.bin").unlink()
    _, counts = build_sharded(ITEMS, make_rows, out, {}, shard_items=4, files_of=lambda row: [row["file"]])
    assert counts["shards_reused"] == 0 and (tmp_path / "item-2.bin").is_file()


def test_rows_of_other_items_are_refused(tmp_path):
    with pytest.raises(RuntimeError, match="make_rows returned rows for"):
        build_sharded(ITEMS, lambda batch: [{"id": "x"} for _ in batch], tmp_path / "i.jsonl", {})


# --- LISM: killed between shards in a child process, on the rehearsal's tiny SAM and CLIP ------

@pytest.fixture(scope="module")
def rehearsal_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    vocab, merges = clip_bpe()
    return (save_tiny_sam(root / "sam", image_size=SAM_IMAGE_SIZE, confident=True, seed=0),
            save_tiny_clip(root / "clip", vocab=vocab, merges=merges))


def _child(manifest: Path, out: Path, models, exit_after: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    env.pop(EXIT_AFTER_ENV, None)
    if exit_after is not None:
        env[EXIT_AFTER_ENV] = str(exit_after)
    return subprocess.run([sys.executable, "-m", "helpers.auxiliary", str(manifest), str(out), *map(str, models),
                           "3", "2"], env=env, capture_output=True, text=True, timeout=300)


def test_sam_extraction_killed_between_shards_resumes_to_the_same_bytes(tmp_path, rehearsal_models):
    manifest = write_synthetic(tmp_path / "data", 11)        # shards of 3 images: 3 + 3 + 3 + 2
    reference = _child(manifest, tmp_path / "reference", rehearsal_models)
    assert reference.returncode == 0, reference.stderr
    summary = json.loads(reference.stdout.splitlines()[-1])
    assert (summary["images"], summary["shards"], summary["shards_reused"], summary["segmented"]) == (11, 4, 0, 11)
    assert summary["with_segment"] >= 1                      # some crops are written, and checked on resume
    assert "segments: 100%" in reference.stderr and "img/s" in reference.stderr   # the progress bar

    out = tmp_path / "aux"
    area = shard_dir(out / "segments.jsonl")
    killed = _child(manifest, out, rehearsal_models, exit_after=1)
    assert killed.returncode == EXIT_CODE, killed.stderr
    assert not (out / "segments.jsonl").exists()
    assert sorted(p.name for p in area.iterdir()) == ["shard-00000.jsonl", "shard-00001.jsonl"]
    finished = _snapshot(area)

    killed_again = _child(manifest, out, rehearsal_models, exit_after=2)
    assert killed_again.returncode == EXIT_CODE, killed_again.stderr
    assert "resuming, 2 of 4 shard(s) already done" in killed_again.stderr
    again = _snapshot(area)
    assert {name: again[name] for name in finished} == finished   # untouched: same bytes and mtime
    assert sorted(again) == ["shard-00000.jsonl", "shard-00001.jsonl", "shard-00002.jsonl"]

    resumed = _child(manifest, out, rehearsal_models)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout.splitlines()[-1])
    assert (summary["shards_reused"], summary["segmented"]) == (3, 2)   # only the last shard's images
    assert (out / "segments.jsonl").read_bytes() == (tmp_path / "reference" / "segments.jsonl").read_bytes()
    assert not area.exists()
    crops = {name: data for name, (data, _) in _snapshot(out).items() if name.startswith("crops/")}
    assert crops == {name: data for name, (data, _) in _snapshot(tmp_path / "reference").items()
                     if name.startswith("crops/")}


# --- LISM and edges in process: other inputs, missing crops, an injected failure -----------------

def _lism(manifest: Path, out: Path, segmenter=None, settings: LismSettings = LismSettings()) -> dict:
    return build_lism(manifest, out, segmenter or CpuSegmenter(), colour_encoders(), settings, batch_images=2,
                      shard_images=4)


def _killed_lism(manifest: Path, out: Path, settings: LismSettings = LismSettings()) -> dict:
    """A build that fails on the 6th image: shard 0 (images 1-4) is done."""
    with pytest.raises(RuntimeError, match="injected failure"):
        _lism(manifest, out, CountingSegmenter(CpuSegmenter(), fail_at=6), settings)
    header = json.loads(shard_path(shard_dir(out / "segments.jsonl"), 0).read_text().splitlines()[0])["shard"]
    assert header["identity"]["manifest_sha256"] == file_sha256(manifest)
    assert (header["first"], header["stop"]) == (0, 4)
    return header


def test_lism_shards_from_another_manifest_are_not_reused(tmp_path):
    manifest = write_scenes(tmp_path / "data", copies=2)      # 12 images: shards of 4
    out = tmp_path / "aux"
    _killed_lism(manifest, out)
    lines = manifest.read_text().splitlines()
    row = json.loads(lines[-1])
    lines[-1] = json.dumps({**row, "caption": row["caption"] + " Gray."})   # one caption, in the last shard
    manifest.write_text("\n".join(lines) + "\n")
    counting = CountingSegmenter(CpuSegmenter())
    summary = _lism(manifest, out, counting)
    assert (summary["shards"], summary["shards_reused"], counting.calls) == (3, 0, 12)
    _lism(manifest, tmp_path / "uninterrupted")
    assert (out / "segments.jsonl").read_bytes() == (tmp_path / "uninterrupted" / "segments.jsonl").read_bytes()


@pytest.mark.parametrize("change", ["settings", "segmenter", "crop deleted"])
def test_lism_shards_of_other_settings_or_with_lost_crops_are_not_reused(tmp_path, change):
    manifest = write_scenes(tmp_path / "data", copies=2)
    out = tmp_path / "aux"
    files = LismSettings(crop_files=True)   # crop PNGs, which a shard's rows name
    _killed_lism(manifest, out, files)
    settings, inner = files, CpuSegmenter()
    if change == "settings":
        settings = LismSettings(drop_full_image=False, crop_files=True)
    elif change == "segmenter":
        inner = CpuSegmenter(bins=6)
    else:
        next((out / "crops").glob("two-0_*.png")).unlink()
    counting = CountingSegmenter(inner)
    summary = _lism(manifest, out, counting, settings)
    assert (summary["shards_reused"], counting.calls) == (0, 12)
    _lism(manifest, tmp_path / "uninterrupted", inner, settings)
    assert (out / "segments.jsonl").read_bytes() == (tmp_path / "uninterrupted" / "segments.jsonl").read_bytes()


def test_edges_killed_mid_build_resume_to_the_same_bytes(tmp_path, monkeypatch):
    manifest = write_scenes(tmp_path / "data", copies=2)
    out = tmp_path / "aux"
    _lism(manifest, out)
    reference = build_edges(manifest, out / "segments.jsonl", tmp_path / "reference", shard_images=4)
    assert (reference["shards"], reference["shards_reused"]) == (3, 0)

    edge_map = Counting(edges_module.edge_map, fail_at=10)
    monkeypatch.setattr(edges_module, "edge_map", edge_map)
    with pytest.raises(RuntimeError, match="injected failure"):      # in shard 2: shards 0 and 1 are done
        build_edges(manifest, out / "segments.jsonl", out, shard_images=4)
    area = shard_dir(out / "edges.jsonl")
    finished = _snapshot(area)
    assert sorted(finished) == ["shard-00000.jsonl", "shard-00001.jsonl"]

    edge_map.calls, edge_map.fail_at = 0, 3
    with pytest.raises(RuntimeError, match="injected failure"):      # killed again, within shard 2
        build_edges(manifest, out / "segments.jsonl", out, shard_images=4)
    assert _snapshot(area) == finished                              # untouched: same bytes and mtime

    edge_map.calls, edge_map.fail_at = 0, None
    summary = build_edges(manifest, out / "segments.jsonl", out, shard_images=4)
    assert (summary["shards_reused"], edge_map.calls) == (2, 4)       # only the last shard's 4 images
    assert (out / "edges.jsonl").read_bytes() == (tmp_path / "reference" / "edges.jsonl").read_bytes()
    assert not area.exists()


@pytest.mark.parametrize("change", ["segments", "settings"])
def test_edges_shards_made_from_other_segments_or_settings_are_not_reused(tmp_path, monkeypatch, change):
    manifest = write_scenes(tmp_path / "data", copies=2)
    out = tmp_path / "aux"
    _lism(manifest, out)
    edge_map = Counting(edges_module.edge_map, fail_at=6)
    monkeypatch.setattr(edges_module, "edge_map", edge_map)
    with pytest.raises(RuntimeError):
        build_edges(manifest, out / "segments.jsonl", out, shard_images=4)
    settings = EdgeSettings()
    if change == "segments":
        _lism(manifest, out, settings=LismSettings(drop_full_image=False))   # a new segments.jsonl
    else:
        settings = EdgeSettings(thresholds="median")
    edge_map.calls, edge_map.fail_at = 0, None
    summary = build_edges(manifest, out / "segments.jsonl", out, settings, shard_images=4)
    assert (summary["shards_reused"], edge_map.calls) == (0, 12)


# --- several jobs: one shard each, then a gather ---------------------------------------------

def test_shard_jobs_then_a_gather_write_the_single_jobs_bytes(tmp_path):
    assert [shard_count(n, 4) for n in (0, 1, 4, 5, 10)] == [0, 1, 1, 2, 3]
    reference, _ = build_sharded(ITEMS, Rows(), tmp_path / "one" / "i.jsonl", {"m": 1}, shard_items=4, batch_items=3)
    out = tmp_path / "split" / "i.jsonl"
    with pytest.raises(UserError, match=r"cannot gather, 3 of 3 shard\(s\) missing .*shard-00000.jsonl \(absent\)"):
        build_sharded(ITEMS, Rows(), out, {"m": 1}, shard_items=4, gather=True)
    for k in (2, 0):
        make = Rows()
        rows, counts = build_sharded(ITEMS, make, out, {"m": 1}, shard_items=4, batch_items=3, only_shard=k)
        assert [row["id"] for row in rows] == [item.id for item in ITEMS[4 * k:4 * k + 4]]
        assert make.batches == ([[8, 9]] if k == 2 else [[0, 1, 2], [3]]) and counts["shards_reused"] == 0
    assert not out.exists() and sorted(p.name for p in shard_dir(out).iterdir()) == ["shard-00000.jsonl",
                                                                                        "shard-00002.jsonl"]
    with pytest.raises(UserError, match=r"1 of 3 shard\(s\) missing .*shard-00001.jsonl \(absent\)"):
        build_sharded(ITEMS, Rows(), out, {"m": 1}, shard_items=4, gather=True)
    with pytest.raises(UserError, match="shard 3 does not exist; 10 items in blocks of 4 make shards 0 to 2"):
        build_sharded(ITEMS, Rows(), out, {"m": 1}, shard_items=4, only_shard=3)
    build_sharded(ITEMS, Rows(), out, {"m": 1}, shard_items=4, batch_items=3, only_shard=1)
    again = Rows()
    assert build_sharded(ITEMS, again, out, {"m": 1}, shard_items=4, only_shard=1)[1]["shards_reused"] == 1
    assert again.batches == []
    with pytest.raises(UserError, match=r"3 of 3 shard\(s\) .*shard-00000.jsonl \(made from other inputs"):
        build_sharded(ITEMS, Rows(), out, {"m": 2}, shard_items=4, gather=True)
    gathered = Rows()
    rows, _ = build_sharded(ITEMS, gathered, out, {"m": 1}, shard_items=4, gather=True)
    assert gathered.batches == [] and rows == reference
    assert out.read_bytes() == (tmp_path / "one" / "i.jsonl").read_bytes()


def _constant_encoders():
    from hnclip.auxiliary.lism import Encoders
    return Encoders(lambda images: np.ones((len(images), 2)), lambda texts: np.ones((len(texts), 2)),
                    lambda text: 3, 77, "constant")


def test_a_shard_made_with_other_sam_weights_at_the_same_path_is_not_reused(tmp_path, caplog):
    from hnclip.auxiliary.sam_masks import DirectSamSegmenter
    manifest = write_synthetic(tmp_path / "data", 4)
    sam = save_tiny_sam(tmp_path / "sam", image_size=SAM_IMAGE_SIZE, confident=True, seed=0)
    out = tmp_path / "aux"
    killed = CountingSegmenter(DirectSamSegmenter(sam, points_per_side=8), fail_at=3)   # shard 0 (2 images) done
    with pytest.raises(RuntimeError, match="injected failure"):
        build_lism(manifest, out, killed, _constant_encoders(), batch_images=2, shard_images=2)
    header = json.loads(shard_path(shard_dir(out / "segments.jsonl"), 0).read_text().splitlines()[0])["shard"]
    names = ("config.json", "model.safetensors", "preprocessor_config.json")
    assert header["identity"]["segmenter"]["files"] == {name: file_sha256(sam / name) for name in names}
    shutil.copytree(out, tmp_path / "control")   # the same weights: shard 0 is reused
    same = CountingSegmenter(DirectSamSegmenter(sam, points_per_side=8))
    control = build_lism(manifest, tmp_path / "control", same, _constant_encoders(), batch_images=2, shard_images=2)
    assert (control["shards_reused"], same.calls) == (1, 2)
    save_tiny_sam(tmp_path / "sam", image_size=SAM_IMAGE_SIZE, confident=True, seed=1)   # other weights, same path
    resumed = CountingSegmenter(DirectSamSegmenter(sam, points_per_side=8))
    summary = build_lism(manifest, out, resumed, _constant_encoders(), batch_images=2, shard_images=2)
    assert (summary["shards"], summary["shards_reused"], resumed.calls) == (2, 0, 4)   # shard 0 made again
    assert "shard-00000.jsonl: made again (made from other inputs or another block (identity differ))" in caplog.text
