"""Resumable, sharded building of a JSONL index (one row per manifest item) that takes hours.

The items are cut into fixed blocks of `shard_items` (block k holds items [k*shard_items,
(k+1)*shard_items)). Each block's rows are written, as soon as they are made, to one atomic file in
the resume area (`hnclip.config.paths.shard_dir(output)`, i.e. `<output>.shards/`):

    <output>.shards/shard-00012.jsonl   line 1: {"shard": header}; then the block's rows, one per line
    header = {"format": 1, "identity": {...}, "index": 12, "first": 3072, "stop": 3328,
              "first_id": ..., "last_id": ...}

`identity` says what the rows were made from: the caller's dict (the input manifest's sha256, the
model/settings fingerprint, other input files' sha256). A restarted job reuses a shard only when its
header equals the one this run would write (same identity, same index and item range), its rows are
the block's items in order, and every file its rows name (`files_of`) still exists; any other shard
is made again and overwritten. So a shard made from another manifest, other settings or other
models, or with another block size, is never reused.

The resume area is not a Snakemake output, so it survives a failed job (as `.cache/checkpoints/` does
for training). Once every block is done, the output is assembled by concatenating the shards' row
lines in order (the lines themselves, so it is byte-identical to an uninterrupted run's), written
atomically, and the resume area is removed. Rows are written as `hnclip.io.write_jsonl` writes them.

Several jobs can share one build: `only_shard=k` makes (or keeps, if reusable) block k's shard and
writes nothing else; `gather=True` makes no rows and assembles the output from the shards, which
must all be there and reusable (else a `UserError` names them); the bytes are the single job's.
`shard_count(n_items, shard_items)` is the number of blocks (for a workflow's scatter).

A progress bar (tqdm, stderr) counts items, with rate and ETA; in a log file (not a terminal) it
refreshes at most once a minute. Test hook: with HNCLIP_EXIT_AFTER_SHARD=k in the environment the
process exits (`os._exit`, code `EXIT_CODE`, as a kill would: no cleanup) right after shard k is written.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tqdm import tqdm

from hnclip.config.paths import shard_dir
from hnclip.errors import UserError
from hnclip.hashing import canonical_json
from hnclip.io import atomic_path

log = logging.getLogger(__name__)

FORMAT = 1
DEFAULT_SHARD_ITEMS = 256      # SAM ViT-H + CLIP-336 on one GPU: minutes per shard, at most that lost on a kill
EXIT_AFTER_ENV = "HNCLIP_EXIT_AFTER_SHARD"
EXIT_CODE = 75


def shard_count(n_items: int, shard_items: int = DEFAULT_SHARD_ITEMS) -> int:
    """The number of shards of a build of `n_items` items: blocks of `shard_items`, the last one shorter."""
    if shard_items < 1 or n_items < 0:
        raise ValueError(f"need shard_items >= 1 and n_items >= 0, got {shard_items} and {n_items}")
    return -(-n_items // shard_items)


def shard_path(resume_dir: Path, index: int) -> Path:
    return resume_dir / f"shard-{index:05d}.jsonl"


def _row_line(row: dict) -> str:
    return json.dumps(row, sort_keys=True) + "\n"   # as hnclip.io.write_jsonl


def _header(identity: dict, index: int, first: int, stop: int, ids: Sequence[str]) -> dict:
    return {"format": FORMAT, "identity": json.loads(canonical_json(identity)), "index": index,
            "first": first, "stop": stop, "first_id": ids[0], "last_id": ids[-1]}


def _reusable(path: Path, header: dict, ids: Sequence[str], base: Path,
              files_of: Callable[[dict], Iterable[str]] | None) -> str | None:
    """None if the shard at `path` can be reused, else why not."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
        found = json.loads(lines[0]).get("shard") if lines else None
        rows = [json.loads(line) for line in lines[1:]]
    except (OSError, ValueError, AttributeError) as error:
        return f"unreadable ({type(error).__name__}: {error})"
    if not isinstance(found, dict):
        return "no shard header"
    if found != header:
        differing = sorted(k for k in set(header) | set(found) if found.get(k) != header.get(k))
        return f"made from other inputs or another block ({', '.join(differing)} differ)"
    if [row.get("id") for row in rows] != list(ids):
        return "its rows are not the block's items"
    missing = [name for row in rows for name in (files_of(row) if files_of else ()) if not (base / name).is_file()]
    if missing:
        return f"{len(missing)} file(s) its rows name are gone (e.g. {missing[0]})"
    return None


def _read_rows(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return handle.readlines()[1:]


def _exit_if_asked(index: int) -> None:
    wanted = os.environ.get(EXIT_AFTER_ENV)
    if wanted is not None and int(wanted) == index:
        sys.stderr.flush()
        os._exit(EXIT_CODE)


def build_sharded(items: Sequence, make_rows: Callable[[Sequence], list[dict]], output: str | Path,
                  identity: dict, *, shard_items: int = DEFAULT_SHARD_ITEMS, batch_items: int = 1,
                  item_id: Callable[[object], str] = lambda item: item.id,
                  files_of: Callable[[dict], Iterable[str]] | None = None,
                  resume_dir: str | Path | None = None, desc: str | None = None, only_shard: int | None = None,
                  gather: bool = False) -> tuple[list[dict], dict]:
    """Make the rows of `items` shard by shard, resuming from the shards a killed run left, and write
    `output` (JSONL, one row per item, in order); returns (rows, counts of shards made and reused).
    `only_shard=k`: block k's shard only (returns its rows; no output). `gather`: the output from the
    existing shards only, which are kept (the workflow that made them removes them).

    `make_rows(batch)` returns one row (with the item's "id") per item of a batch of at most
    `batch_items` consecutive items of one shard; a shard's batches are always the same, resumed or
    not. `files_of(row)` names the files (relative to output's folder) a row refers to.
    """
    if shard_items < 1 or batch_items < 1:
        raise ValueError(f"shard_items and batch_items must be >= 1, got {shard_items} and {batch_items}")
    output = Path(output)
    resume_dir = Path(resume_dir) if resume_dir is not None else shard_dir(output)
    ids = [item_id(item) for item in items]
    blocks = [(k, first, min(first + shard_items, len(items))) for k, first in
              enumerate(range(0, len(items), shard_items))]
    headers = {k: _header(identity, k, first, stop, ids[first:stop]) for k, first, stop in blocks}
    if only_shard is not None and not 0 <= only_shard < len(blocks):
        raise UserError(f"{output}: shard {only_shard} does not exist; {len(items)} items in blocks of "
                        f"{shard_items} make shards 0 to {len(blocks) - 1}")
    todo, unusable = [], []
    for k, first, stop in blocks:
        if only_shard is not None and k != only_shard:
            continue
        path = shard_path(resume_dir, k)
        reason = _reusable(path, headers[k], ids[first:stop], output.parent, files_of) if path.exists() else "absent"
        if reason is not None:
            if reason != "absent" and not gather:
                log.warning("%s: made again (%s)", path, reason)
            todo.append((k, first, stop))
            unusable.append(f"{path.name} ({reason})")
    if gather and unusable:
        raise UserError(f"{output}: cannot gather, {len(unusable)} of {len(blocks)} shard(s) missing or not "
                        f"made from these inputs: {'; '.join(unusable[:5])}{' ...' if len(unusable) > 5 else ''}; "
                        f"make them first (--shard K for each K listed)")
    considered = blocks if only_shard is None else [blocks[only_shard]]
    reused = len(considered) - len(todo)
    if reused and only_shard is None:
        print(f"{output}: resuming, {reused} of {len(blocks)} shard(s) already done in {resume_dir}",
              file=sys.stderr, flush=True)   # in the job's log whatever the logging setup
    elif reused:
        print(f"{output}: shard {only_shard} already done in {resume_dir}", file=sys.stderr, flush=True)
    interactive = sys.stderr.isatty()
    total = sum(stop - first for _, first, stop in considered)
    with tqdm(total=total, initial=total - sum(stop - first for _, first, stop in todo),
              unit="img", desc=desc or output.name, file=sys.stderr, mininterval=0.5 if interactive else 60,
              smoothing=0.05, dynamic_ncols=interactive) as bar:
        for k, first, stop in todo:
            lines = [json.dumps({"shard": headers[k]}, sort_keys=True) + "\n"]
            for start in range(first, stop, batch_items):
                batch = items[start:min(start + batch_items, stop)]
                rows = make_rows(batch)
                if [row.get("id") for row in rows] != ids[start:start + len(batch)]:
                    raise RuntimeError(f"make_rows returned rows for {[row.get('id') for row in rows]}, "
                                       f"expected {ids[start:start + len(batch)]}")
                lines += [_row_line(row) for row in rows]
                bar.update(len(batch))
            with atomic_path(shard_path(resume_dir, k)) as tmp:
                tmp.write_text("".join(lines), encoding="utf-8")
            _exit_if_asked(k)
    if only_shard is not None:
        rows = [json.loads(line) for line in _read_rows(shard_path(resume_dir, only_shard))]
        return rows, {"shards": len(blocks), "shards_reused": reused, "shard_items": shard_items,
                      "shard": only_shard}
    rows: list[dict] = []
    with atomic_path(output) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        for k, _, _ in blocks:
            lines = _read_rows(shard_path(resume_dir, k))
            handle.writelines(lines)
            rows += [json.loads(line) for line in lines]
    if not gather:
        shutil.rmtree(resume_dir, ignore_errors=True)
    return rows, {"shards": len(blocks), "shards_reused": reused, "shard_items": shard_items}
