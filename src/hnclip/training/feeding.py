"""Where the training loop's micro-batches come from (`execution.loader_workers`). One concept at two
layers: this is the training side (the loop's micro-batches, in its order, across accumulation groups);
the worker-process loader it uses, which evaluation uses too, is `hnclip.data.feeding`.

0 (the default): `method.load` on the main process, one micro-batch after the other, the loop's
original code. N > 0: N workers load the micro-batches ahead of the optimizer steps: processes
(`hnclip.data.feeding.LoadFeed`) where a load decodes images, threads of the training process
(`hnclip.data.feeding.ThreadFeed`) where it only reads the image cache (`Method.load_reads_memory`: HN-CLIP's,
plain fine-tuning's and FineLIP's micro-batches with execution.image_cache on). Either way they load
across accumulation groups and epochs, in the loop's order: one pass
from the position the loop is at (a resumed run starts mid-epoch) through the job's last epoch, begun
when the feed is made (the loop makes it before the initial evaluation, so the workers start and load
the first micro-batches meanwhile) and running on through each epoch's end (the next epoch's first
micro-batches load during the evaluation), each item checked against the micro-batch the loop asks for.
The loop therefore gets the same micro-batches in the same order either way, and trains to the same
weights.

This is safe because every framework's `load` is a pure function of its indices: HN-CLIP's and
FineLIP's (`PairDataset.batch`: decode, open_clip's eval transform, tokens made up front; with the image
cache on an accelerator `PairDataset.pixel_batch`, uint8 pixels that `Method.to_device` normalizes), GOAL's and
StructXLIP's (`hnclip.auxiliary.batches`: the same images plus precomputed segments, edge maps and
filtered captions, tokenized deterministically). None draws random numbers, so a worker's RNG cannot
change what it returns. Their per-sample caches are per worker, as the images'.
"""
from __future__ import annotations

from hnclip.data.feeding import LoadFeed, ThreadFeed
from hnclip.training.batching import accumulation_groups, epoch_micro_batches


class MicroBatchFeed:
    """One run's worker feed: one pass through the job's remaining epochs, from `start` (epoch, group), or
    from the first group the loop asks for; a group out of the pass's order begins a new pass there."""

    def __init__(self, run, workers: int, start: tuple[int, int] | None = None, last_epoch: int | None = None):
        self.run = run
        feed = ThreadFeed if run.method.load_reads_memory else LoadFeed
        self.feed = feed(run.method.load, workers, run.device)
        self.last_epoch = run.recipe["epochs"] if last_epoch is None else last_epoch   # 1-based, inclusive
        self.plan: list[tuple[int, int]] = []   # (epoch, group) of the current pass, in order
        self.served = 0                          # groups of the pass handed over so far
        if start is not None:
            self._start(*start)

    def _groups(self, epoch: int) -> list[list[list[int]]]:
        run, recipe = self.run, self.run.recipe
        return accumulation_groups(epoch_micro_batches(run.indices, recipe["micro_batch"], run.job.spec["seed"],
                                                       epoch), recipe["grad_accum"])

    def _start(self, epoch: int, group_index: int) -> None:
        self.plan, index_lists = [], []
        for e in range(epoch, max(self.last_epoch, epoch + 1)):
            groups = self._groups(e)
            for g in range(group_index if e == epoch else 0, len(groups)):
                self.plan.append((e, g))
                index_lists += [self.run.distributed.local_slice(ix) for ix in groups[g]]
        self.served = 0
        self.feed.start(index_lists)

    def group(self, epoch: int, group_index: int, group: list[list[int]]) -> list:
        """The micro-batches of accumulation group `group_index` of `epoch`, on the run's device."""
        run = self.run
        if self.served >= len(self.plan) or self.plan[self.served] != (epoch, group_index):
            if self._groups(epoch)[group_index] != group:
                raise RuntimeError(f"epoch {epoch + 1}, group {group_index}: the loop's micro-batches are not "
                                   f"the epoch's (training.batching): the feed cannot load ahead of it")
            self._start(epoch, group_index)
        loaded = self.feed.take([run.distributed.local_slice(ix) for ix in group])
        self.served += 1
        return [run.method.to_device(batch, run.device) for batch in loaded]

    def close(self) -> None:
        """Stop the workers (the run's last step is done, or it failed)."""
        self.feed.close()


def group_batches(run, epoch: int, group_index: int, group: list[list[int]]) -> list:
    """The micro-batches of accumulation group `group_index` of `epoch`, on the run's device: loaded here
    (`run.feed` None) or by the run's loader workers."""
    if run.feed is None:
        return [run.method.to_device(run.method.load(run.distributed.local_slice(ix)), run.device) for ix in group]
    return run.feed.group(epoch, group_index, group)
