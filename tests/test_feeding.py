"""Decoding in loader workers (execution.loader_workers) changes where images are decoded, never what
trains or what is measured: the same micro-batches in the same order, the same weights and recalls.
Neither does the image cache (execution.image_cache), which decodes nothing at all. And the
decoded-image cache is an LRU bounded in bytes (execution.image_cache_mb)."""
import concurrent.futures
import shutil
import threading
from types import SimpleNamespace

import pytest
import torch
from helpers.training import EVALUATION, EXECUTION, SPEC, run_with_faults

from hnclip.data.feeding import LoadFeed, ThreadFeed, image_batches
from hnclip.data.image_cache import PixelTransform, write_image_cache
from hnclip.data.loader import ImageCache, PairDataset
from hnclip.evaluation.retrieval import encode_images
from hnclip.models.factory import create
from hnclip.training.batching import accumulation_groups, epoch_micro_batches
from hnclip.training.feeding import MicroBatchFeed, group_batches
from hnclip.training.loop import TrainJob, train
from hnclip.training.methods import Method


def make_job(tiny_data, out, workers: int, image_cache: bool = False) -> TrainJob:
    return TrainJob(run_id="feeding-run", spec=SPEC, spec_hash="f" * 64, init_kind="scratch", init_path=None,
                    model_config="hnclip-tiny", train_manifest=tiny_data["train"],
                    eval_manifests={"docci": tiny_data["test"]}, out_dir=out / "run", checkpoint_dir=out / "ckpt",
                    execution={**EXECUTION, "loader_workers": workers, "image_cache": image_cache},
                    evaluation=EVALUATION)


@pytest.fixture(scope="module")
def inline(tiny_data, tmp_path_factory) -> dict:
    """The training record of the reference run: no workers, no image cache."""
    return train(make_job(tiny_data, tmp_path_factory.mktemp("w0"), 0))


def r1(record: dict) -> list:
    return [(h["eval"]["docci"]["t2i"]["R@1"], h["eval"]["docci"]["i2t"]["R@1"]) for h in record["history"]]


def test_two_loader_workers_train_to_the_same_weights_and_recalls_as_none(tiny_data, tmp_path, inline):
    workers = train(make_job(tiny_data, tmp_path / "w2", 2))
    assert workers["optimizer_steps"] == inline["optimizer_steps"] == 6
    assert workers["final_weights_sha256"] == inline["final_weights_sha256"]
    assert [h["weights_sha256"] for h in workers["history"]] == [h["weights_sha256"] for h in inline["history"]]
    assert r1(workers) == r1(inline)
    assert [h["eval"] for h in workers["history"]] == [h["eval"] for h in inline["history"]]


def test_a_run_killed_with_workers_resumes_mid_epoch_to_the_same_weights(tiny_data, tmp_path, inline):
    reference = inline
    job = make_job(tiny_data, tmp_path / "killed", 2)
    proc = run_with_faults(job, {"kill_after_step": 5})   # its workers see their parent die and exit
    assert proc.returncode == -9, proc.stderr
    resumed = train(job)   # from step 4: epoch 2's second group, where the feed's pass starts
    assert resumed["resumed_from_step"] == 4
    assert resumed["final_weights_sha256"] == reference["final_weights_sha256"]
    assert r1(resumed) == r1(reference)


def test_the_image_cache_trains_to_the_same_weights_and_recalls_and_decodes_nothing(tiny_data, tmp_path, inline):
    """uint8 pixels from the memory-mapped cache, through two workers, normalized where the step runs: the
    same weights and recalls as decoding. Without the cache each image is decoded once (the second epoch
    and later evaluations decode none); with it, none is decoded."""
    shutil.copytree(tiny_data["train"].parent, tmp_path / "docci")
    data = {split: tmp_path / "docci" / path.name for split, path in tiny_data.items()}
    transform = PixelTransform.from_preprocess(create("hnclip-tiny").preprocess)
    for manifest in data.values():
        write_image_cache(manifest, transform)
    cached = train(make_job(data, tmp_path / "cached", 2, image_cache=True))
    assert cached["final_weights_sha256"] == inline["final_weights_sha256"]
    assert [h["eval"] for h in cached["history"]] == [h["eval"] for h in inline["history"]]
    assert cached["initial_eval"] == inline["initial_eval"]
    assert cached["training"]["image_cache"] is True and inline["training"]["image_cache"] is False
    assert cached["training"]["images_decoded"] == {"train": 0, "eval": {"docci": 0}}
    assert inline["training"]["images_decoded"] == {"train": 48, "eval": {"docci": 24}}  # 2 epochs, 3 evaluations
    # nothing to decode: the two workers were threads of the training process
    assert cached["training"]["loader"] == {"workers": 2, "kind": "threads"}
    assert inline["training"]["loader"] == {"workers": 0, "kind": None}


class _Loads:
    """PairDataset.batch, recording that it ran in this process, and in which threads (worker processes
    record in their own copies)."""

    def __init__(self, data):
        self.data, self.calls, self.threads = data, [], set()

    def __call__(self, indices):
        self.calls.append(list(indices))
        self.threads.add(threading.current_thread().name)
        return self.data.batch(indices)


def _run(data, workers: int, epochs: int = 2, reads_memory: bool = False):
    recipe = {"micro_batch": 8, "grad_accum": 2, "epochs": epochs}
    load = _Loads(data)
    method = Method("full", load, None, load_reads_memory=reads_memory)
    run = SimpleNamespace(method=method, device=torch.device("cpu"), recipe=recipe,
                          job=SimpleNamespace(spec={"seed": 7}), feed=None,
                          indices=list(range(len(data))), distributed=SimpleNamespace(local_slice=lambda ix: ix))
    if workers:
        run.feed = MicroBatchFeed(run, workers)
    return run


def test_the_feed_serves_each_group_from_where_the_loop_starts(tiny_data):
    backbone = create("hnclip-tiny")
    data = PairDataset.from_manifest(tiny_data["train"], backbone.preprocess, backbone.tokenizer)
    run = _run(data, workers=2)
    for epoch, first in ((0, 1), (1, 0)):   # a resumed run starts mid-epoch; the next epoch from its start
        groups = accumulation_groups(epoch_micro_batches(run.indices, 8, 7, epoch), 2)
        for g in range(first, len(groups)):
            got = group_batches(run, epoch, g, groups[g])
            want = [data.batch(ix) for ix in groups[g]]
            assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, want, strict=True))
    assert run.method.load.calls == []   # every micro-batch was loaded by a worker
    run.feed.close()

    inline = _run(data, workers=0)
    groups = accumulation_groups(epoch_micro_batches(inline.indices, 8, 7, 0), 2)
    group_batches(inline, 0, 0, groups[0])
    assert inline.method.load.calls == groups[0]


def test_loads_that_only_read_memory_are_fed_by_threads_of_this_process(tiny_data, tmp_path):
    """The image cache's micro-batches: the same tensors, in the loop's order, loaded ahead by the feed's
    threads (not the training thread, not worker processes)."""
    shutil.copytree(tiny_data["train"].parent, tmp_path / "docci")
    manifest = tmp_path / "docci" / tiny_data["train"].name
    backbone = create("hnclip-tiny")
    write_image_cache(manifest, PixelTransform.from_preprocess(backbone.preprocess))
    data = PairDataset.from_manifest(manifest, backbone.preprocess, backbone.tokenizer, image_cache=True)
    run = _run(data, workers=2, reads_memory=True)
    assert run.feed.feed.kind == "threads" and isinstance(run.feed.feed, ThreadFeed)
    expected = []
    for epoch in (0, 1):
        groups = accumulation_groups(epoch_micro_batches(run.indices, 8, 7, epoch), 2)
        for g, group in enumerate(groups):
            got = group_batches(run, epoch, g, group)
            want = [data.batch(ix) for ix in group]
            assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, want, strict=True))
            expected += group
    run.feed.close()
    assert run.method.load.calls == expected   # each micro-batch loaded once, in order, here
    assert run.method.load.threads and all(name.startswith("hnclip-feed") for name in run.method.load.threads)
    assert _run(data, workers=2).feed.feed.kind == "processes"


def test_a_thread_feed_starts_over_checks_the_order_and_raises_a_loads_error():
    calls = []

    def load(indices):
        calls.append(indices)
        if indices == [9]:
            raise ValueError("unreadable row 9")
        return torch.tensor(indices)

    feed = ThreadFeed(load, 2, "cpu", ahead=2)
    feed.start([[0, 1], [2], [3], [4]])
    assert [t.tolist() for t in feed.take([[0, 1]])] == [[0, 1]]
    concurrent.futures.wait(feed._pending)
    assert sorted(calls) == [[0, 1], [2], [3]]   # 2 ahead of what was taken, not [4]
    feed.start([[5], [6]])   # a new pass drops the rest of the old one
    assert [t.tolist() for t in feed.take([[5]])] == [[5]]
    with pytest.raises(RuntimeError, match="disagree on the order"):
        feed.take([[7]])
    concurrent.futures.wait(feed._pending)   # [6] loaded, not taken: dropped by the next pass
    feed.start([[8], [9]])
    assert feed.take([[8]])[0].tolist() == [8]
    with pytest.raises(ValueError, match="unreadable row 9"):
        feed.take([[9]])
    with pytest.raises(RuntimeError, match="no more loads"):
        feed.take([[10]])
    feed.close()
    assert sorted(calls) == [[0, 1], [2], [3], [5], [6], [8], [9]]


def test_a_thread_feed_for_an_accelerator_pins_on_the_runs_device(monkeypatch):
    """Each feed thread selects the run's device before it pins (else every rank of a multi-GPU job would
    open a context on the default device)."""
    selected, pinned = [], []
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda index: selected.append(index))
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a: pinned.append(self.tolist()) or self.clone())
    feed = ThreadFeed(lambda ix: (torch.tensor(ix), torch.zeros(1)), 2, "cuda:1")
    feed.start([[0], [1], [2]])
    assert [pair[0].tolist() for pair in feed.take([[0], [1], [2]])] == [[0], [1], [2]]
    feed.close()
    assert selected and set(selected) == {1}   # once per thread that started
    assert sorted(map(str, pinned)) == sorted(map(str, [[0], [0.0], [1], [0.0], [2], [0.0]]))


def test_a_feed_refuses_micro_batches_out_of_its_order(tiny_data):
    backbone = create("hnclip-tiny")
    data = PairDataset.from_manifest(tiny_data["train"], backbone.preprocess, backbone.tokenizer)
    feed = LoadFeed(data.batch, 1, "cpu")
    feed.start([[0, 1], [2, 3]])
    with pytest.raises(RuntimeError, match="disagree on the order"):
        feed.take([[2, 3]])
    feed.close()


def test_evaluation_with_workers_encodes_the_same_features_and_fills_the_cache(tiny_data):
    backbone = create("hnclip-tiny")
    model = backbone.model.eval()
    inline = PairDataset.from_manifest(tiny_data["test"], backbone.preprocess, backbone.tokenizer)
    pooled = PairDataset.from_manifest(tiny_data["test"], backbone.preprocess, backbone.tokenizer, loader_workers=2)
    reference = encode_images(model, inline, batch_size=5)
    assert torch.equal(encode_images(model, pooled, batch_size=5), reference)
    assert all(pooled.cached(i) for i in range(len(pooled)))   # decoded by workers, kept here
    assert all(torch.equal(pooled.image(i), inline.image(i)) for i in range(len(pooled)))
    assert torch.equal(encode_images(model, pooled, batch_size=5), reference)   # from the cache, no workers
    uncached = PairDataset.from_manifest(tiny_data["test"], backbone.preprocess, backbone.tokenizer, False)
    assert [b.shape[0] for b in image_batches(uncached, 10, workers=2)] == [10, 10, 4]
    assert not any(uncached.cached(i) for i in range(len(uncached)))


def test_the_image_cache_is_an_lru_bounded_in_bytes():
    image = torch.zeros(3, 8, 8)   # 768 bytes
    cache = ImageCache(3 * 768)
    for key in range(3):
        cache.put(key, image.clone())
    assert cache.get(0) is not None   # 0 is now the most recently used
    cache.put(3, image.clone())
    assert 1 not in cache and {0, 2, 3} <= {k for k in range(4) if k in cache}
    assert cache.bytes == 3 * 768 and len(cache) == 3
    cache.put(4, torch.zeros(3, 16, 16))   # larger than the whole budget: not kept, nothing evicted
    assert 4 not in cache and len(cache) == 3


def test_the_default_budget_caches_a_dataset_whole_and_zero_caches_nothing(tiny_data):
    backbone = create("hnclip-tiny")
    whole = PairDataset.from_manifest(tiny_data["train"], backbone.preprocess, backbone.tokenizer)
    first = whole.image(0)
    for i in range(len(whole)):
        whole.image(i)
    assert all(whole.cached(i) for i in range(len(whole))) and whole.image(0) is first
    small = PairDataset.from_manifest(tiny_data["train"], backbone.preprocess, backbone.tokenizer,
                                      cache_mb=2 * first.numel() * first.element_size() / 2**20)
    for i in range(3):
        small.image(i)
    assert [small.cached(i) for i in range(3)] == [False, True, True]
    none = PairDataset.from_manifest(tiny_data["train"], backbone.preprocess, backbone.tokenizer, cache_mb=0)
    assert none.image(0) is not none.image(0)


def test_pinning_keeps_each_batch_kind(monkeypatch):
    """On accelerators the DataLoader pins what workers return (`Loaded.pin_memory`): tuples stay tuples
    (`Method.to_device` tests for one), GOAL's and StructXLIP's dataclasses keep their types and non-tensors."""
    from hnclip.data.feeding import Loaded
    from hnclip.losses.structxlip import StructXBatch
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a: pinned.append(self.shape) or self.clone())
    pair = Loaded([0, 1], (torch.zeros(2, 3), torch.ones(2, 4))).pin_memory()
    assert type(pair.value) is tuple and pair.indices == [0, 1] and len(pinned) == 2
    t = torch.zeros(2, 1)
    batch = StructXBatch(t, t, t, t, t, t, t, chunk_spans=[[(1, 3)], [(1, 2)]])
    out = Loaded([0, 1], batch).pin_memory().value
    assert type(out) is StructXBatch and out.chunk_spans == batch.chunk_spans and len(pinned) == 9
