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
"""
from __future__ import annotations

import dataclasses
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


class LoadFeed:
    """`load(indices)` of a sequence of index lists, computed ahead by `workers` processes that live as
    long as the feed (so their caches last from one pass to the next), returned in the order given."""

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
        loaded = [next(self._items) for _ in index_lists]
        for item, expected in zip(loaded, index_lists, strict=True):
            if item.indices != list(expected):
                raise RuntimeError(f"the loader delivered indices {item.indices[:4]}... where "
                                   f"{list(expected)[:4]}... were due: feed and consumer disagree on the order")
        return [item.value for item in loaded]

    def close(self) -> None:
        """Stop the workers now (else they stop when the feed is garbage-collected)."""
        iterator = getattr(self._loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        self._loader._iterator = None
        self._items = None


def image_batches(dataset, batch_size: int, workers: int | None = None,
                  device: str | torch.device = "cpu") -> Iterator[torch.Tensor]:
    """A dataset's images as stacked batches of `batch_size`, in manifest order. With workers (default:
    the dataset's `loader_workers`), unless the main process has every image cached already, the batches
    are decoded by that many processes and each image is then cached here, so a later pass (the next
    epoch's evaluation) reads this process's cache instead of starting workers again."""
    workers = getattr(dataset, "loader_workers", 0) if workers is None else workers
    spans = [list(range(start, min(start + batch_size, len(dataset)))) for start in range(0, len(dataset), batch_size)]
    if getattr(dataset, "pixels", None) is not None:  # the image cache: nothing to decode
        yield from cached_image_batches(dataset, spans, device)
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


def cached_image_batches(dataset, spans: list[list[int]], device: str | torch.device) -> Iterator[torch.Tensor]:
    """The image cache's batches of `spans`, normalized on `device`: read from the memory map, copied as
    uint8 (from pinned pages, without blocking, on an accelerator), normalized there. The next batch is read
    while the device works on this one."""
    for span in spans:
        yield dataset.normalize(to_device(dataset.pixels.take(span), device))


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
