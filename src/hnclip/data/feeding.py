"""Decoding in worker processes: a `torch.utils.data.DataLoader` that hands over, in order, what a
function of an index list returns (training: one micro-batch per list; evaluation: a stack of images).
One concept at two layers: this is the data side; the training loop's feed of micro-batches built on it
is `hnclip.training.feeding`.

Only the decoding moves: every item is the same pure function of its indices as on the main process,
delivered in the order asked for, so the consumer sees the same tensors in the same order whatever the
number of workers. The DataLoader draws its workers' seeds from a generator of its own, never from the
global RNG the training loop's randomness (and its resume checkpoint) depends on. Memory is pinned for
accelerators (cuda, npu), whose host-to-device copies are faster from pinned pages.

Each worker is a forked copy of the dataset: it has its own decoded-image cache, filled by what it
decodes (bounded like the main process's, `execution.image_cache_mb`); it starts with the main
process's cache as it was at the fork.

Where a load decodes nothing (micro-batches gathered from the memory-mapped image cache,
`hnclip.data.image_cache`), `ThreadFeed` computes it ahead in threads of this process instead. A worker
process hands each batch over through a shared-memory segment of its own (allocated, filled, page-faulted
on both sides, freed: on a 2-core CPU 1-1.5 ms of CPU an image against 0.2 ms for the gather itself,
`benchmarks/loop_throughput.py`), and its fork shares the trainer's heap copy-on-write; a thread reads the
same page cache and hands over a reference. The gather and the normalization are numpy and torch kernels
that release the GIL, so the thread runs beside the training step, as FFCV's loader threads do beside
theirs (ffcv/loader/epoch_iterator.py: `EpochIterator(Thread)`).
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence

import torch

PINNED_DEVICE_TYPES = ("cuda", "npu")
_WORKER_SEED = 0   # seeds the DataLoader's own generator (the loads draw no random numbers; see module doc)


def pins_memory(device: str | torch.device) -> bool:
    return torch.device(device).type in PINNED_DEVICE_TYPES


def pin(batch):
    """`batch` with its tensors in pinned memory: a tensor, a tuple of them, or a dataclass holding some
    (GOAL's and StructXLIP's micro-batches); other values as they are."""
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, tuple):
        return type(batch)(pin(part) for part in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{f.name: pin(getattr(batch, f.name)) for f in dataclasses.fields(batch)
                                             if isinstance(getattr(batch, f.name), torch.Tensor)})
    return batch


@dataclasses.dataclass
class Loaded:
    """One item from a worker: the indices it was asked for and what the load made of them."""
    indices: list[int]
    value: object

    def pin_memory(self, device=None) -> Loaded:   # the DataLoader's pinning thread calls this
        return Loaded(self.indices, pin(self.value))


class _Loads(torch.utils.data.Dataset):
    """Item of an index list = load(index list). The DataLoader's sampler hands over index lists."""

    def __init__(self, load: Callable[[list[int]], object]):
        self.load = load

    def __getitem__(self, indices: list[int]) -> Loaded:
        return Loaded(list(indices), self.load(list(indices)))


class _Plan(torch.utils.data.Sampler):
    """The index lists to load next, in order; replaced before each pass (as DistributedSampler.set_epoch)."""

    def __init__(self):
        self.items: list[list[int]] = []

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def _as_is(item):
    return item   # no collation: an item is already what the consumer takes


def _loader(load, workers: int, device, persistent: bool) -> tuple[torch.utils.data.DataLoader, _Plan]:
    plan = _Plan()
    loader = torch.utils.data.DataLoader(
        _Loads(load), batch_size=None, sampler=plan, num_workers=workers, collate_fn=_as_is,
        pin_memory=pins_memory(device), persistent_workers=persistent,
        generator=torch.Generator().manual_seed(_WORKER_SEED))
    return loader, plan


def _checked(loaded: list[Loaded], index_lists: Sequence[Sequence[int]]) -> list:
    for item, expected in zip(loaded, index_lists, strict=True):
        if item.indices != list(expected):
            raise RuntimeError(f"the loader delivered indices {item.indices[:4]}... where "
                               f"{list(expected)[:4]}... were due: feed and consumer disagree on the order")
    return [item.value for item in loaded]


class LoadFeed:
    """`load(indices)` of a sequence of index lists, computed ahead by `workers` processes that live as
    long as the feed (so their caches last from one pass to the next), returned in the order given."""
    kind = "processes"

    def __init__(self, load: Callable[[list[int]], object], workers: int, device: str | torch.device):
        if workers < 1:
            raise ValueError(f"a feed needs at least one worker process, got {workers}")
        self._loader, self._plan = _loader(load, workers, device, persistent=True)
        self._items: Iterator[Loaded] | None = None

    def start(self, index_lists: Sequence[Sequence[int]]) -> None:
        """Begin a pass over `index_lists` (a pass not read to its end is dropped)."""
        self._plan.items = [list(ix) for ix in index_lists]
        self._items = iter(self._loader)

    def take(self, index_lists: Sequence[Sequence[int]]) -> list:
        """The next len(index_lists) loads of the pass, which must be those of `index_lists`."""
        if self._items is None:
            raise RuntimeError("take() before start()")
        return _checked([next(self._items) for _ in index_lists], index_lists)

    def close(self) -> None:
        """Stop the workers now (else they stop when the feed is garbage-collected)."""
        iterator = getattr(self._loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        self._loader._iterator = None
        self._items = None


def _device_index(device: str | torch.device) -> int:
    device = torch.device(device)
    return device.index if device.index is not None else torch.accelerator.current_device_index()


class ThreadFeed:
    """LoadFeed's contract (`start`, `take`, `close`: the loads of a pass, in order, checked) from `workers`
    threads of this process, at most `ahead` loads (default 2 per thread, the DataLoader's prefetch_factor)
    computed or waiting at any time. For loads that only read memory: the image cache's micro-batches."""
    kind = "threads"

    def __init__(self, load: Callable[[list[int]], object], workers: int, device: str | torch.device,
                 ahead: int | None = None):
        if workers < 1:
            raise ValueError(f"a feed needs at least one worker thread, got {workers}")
        self._load, self._pins = load, pins_memory(device)
        self._ahead = ahead or 2 * workers
        # a thread that pins works on the run's device, not the process's default one (which would open a
        # context there for every rank of a multi-GPU job), as the DataLoader's pinning thread does
        # (torch/utils/data/_utils/pin_memory.py: `torch.accelerator.set_device_index`)
        setup = functools.partial(torch.accelerator.set_device_index, _device_index(device)) if self._pins else None
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="hnclip-feed",
                                                           initializer=setup)
        self._pending: collections.deque[concurrent.futures.Future] = collections.deque()
        self._todo: Iterator[list[int]] | None = None

    def _loaded(self, indices: list[int]) -> Loaded:
        value = self._load(indices)
        return Loaded(indices, pin(value) if self._pins else value)

    def _submit_next(self) -> None:
        indices = next(self._todo, None)
        if indices is not None:
            self._pending.append(self._pool.submit(self._loaded, indices))

    def start(self, index_lists: Sequence[Sequence[int]]) -> None:
        """Begin a pass over `index_lists` (a pass not read to its end is dropped)."""
        self._drop_pass()
        self._todo = iter([list(ix) for ix in index_lists])
        for _ in range(self._ahead):
            self._submit_next()

    def take(self, index_lists: Sequence[Sequence[int]]) -> list:
        """The next len(index_lists) loads of the pass, which must be those of `index_lists`."""
        if self._todo is None:
            raise RuntimeError("take() before start()")
        loaded = []
        for _ in index_lists:
            if not self._pending:
                raise RuntimeError("the pass has no more loads: feed and consumer disagree on the order")
            loaded.append(self._pending.popleft().result())   # a load's exception is raised here
            self._submit_next()
        return _checked(loaded, index_lists)

    def _drop_pass(self) -> None:
        for future in self._pending:
            future.cancel()   # a load already running finishes; its result is dropped with the future
        self._pending.clear()
        self._todo = None

    def close(self) -> None:
        """Drop the pass and stop the threads (after the loads running now)."""
        self._drop_pass()
        self._pool.shutdown(wait=True)


def image_batches(dataset, batch_size: int, workers: int | None = None,
                  device: str | torch.device = "cpu") -> Iterator[torch.Tensor]:
    """A dataset's images as stacked batches of `batch_size`, in manifest order. With workers (default:
    the dataset's `loader_workers`), unless the main process has every image cached already, the batches
    are decoded by that many processes and each image is then cached here, so a later pass (the next
    epoch's evaluation) reads this process's cache instead of starting workers again. From the image
    cache nothing is decoded: the workers are threads that read ahead (`cached_image_batches`)."""
    workers = getattr(dataset, "loader_workers", 0) if workers is None else workers
    spans = [list(range(start, min(start + batch_size, len(dataset)))) for start in range(0, len(dataset), batch_size)]
    if getattr(dataset, "pixels", None) is not None:  # the image cache: nothing to decode
        yield from cached_image_batches(dataset, spans, device, workers)
        return
    if workers == 0 or all(dataset.cached(i) for i in range(len(dataset))):
        for span in spans:
            yield torch.stack([dataset.image(i) for i in span])
        return
    loader, plan = _loader(_ImageStack(dataset), min(workers, len(spans)), device, persistent=False)
    plan.items = spans
    for item in loader:
        for k, index in enumerate(item.indices):
            if not dataset.cached(index):
                dataset.keep(index, item.value[k].clone())  # its own storage, not a view of the batch
        yield item.value


def cached_image_batches(dataset, spans: list[list[int]], device: str | torch.device,
                         workers: int = 0) -> Iterator[torch.Tensor]:
    """The image cache's batches of `spans`, normalized on `device`: read from the memory map, copied as
    uint8 (from pinned pages, without blocking, on an accelerator), normalized there; on the CPU normalized
    where they are read. With `workers`, that many threads read (and on the CPU normalize) the next batches
    while this one is encoded (`ThreadFeed`); else each is read when it is due."""
    on_cpu = torch.device(device).type == "cpu"

    def read(span: list[int]) -> torch.Tensor:
        pixels = dataset.pixels.take(span)
        return dataset.normalize(pixels) if on_cpu else pixels

    def ready(batch: torch.Tensor) -> torch.Tensor:
        return batch if on_cpu else dataset.normalize(to_device(batch, device))
    if workers == 0 or len(spans) < 2:
        for span in spans:
            yield ready(read(span))
        return
    feed = ThreadFeed(read, min(workers, len(spans) - 1), device)
    feed.start(spans)
    try:
        for span in spans:
            yield ready(feed.take([span])[0])
    finally:
        feed.close()


def to_device(tensor: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """`tensor` on `device`; to an accelerator from pinned memory without blocking the host (the caching
    host allocator keeps the pinned pages until the copy is done)."""
    if not pins_memory(device):
        return tensor.to(device)
    return (tensor if tensor.is_pinned() else tensor.pin_memory()).to(device, non_blocking=True)


class _ImageStack:
    """indices -> the stacked images of those rows (a picklable function of a dataset)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __call__(self, indices: list[int]) -> torch.Tensor:
        return torch.stack([self.dataset.image(i) for i in indices])
