"""One file from the Hugging Face Hub (`hub_repo` in sources.py), fetched with `hf_hub_download` at its
pinned commit, then verified and marked like any download (verified_files.py)."""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from pathlib import Path

from hnclip.data.download_errors import (
    ChecksumMismatch,
    DownloadError,
    OfflineError,
    describe,
    naming_superseded,
    offline_message,
)
from hnclip.data.sources import MIRROR_ENV, SourceFile
from hnclip.data.verified_files import check_algorithm, commit_verified, verify_existing

log = logging.getLogger(__name__)


def download_hub_file(source_file: SourceFile, dest: str | os.PathLike, *, progress: bool = True) -> Path:
    """Fetch a Hub file with `hf_hub_download` at its pinned commit; return `dest` once it verifies.

    The library does the transfer: the Hub's redirects and Xet storage, tokens for gated repos,
    retries, resuming a broken body within the call, and copying a file already in the Hugging Face
    cache. It keeps no partial bytes across runs, so a killed transfer starts over. The file lands in
    `.hub-<name>/` next to `dest` and is moved onto `dest` only once it verifies, like any download.
    """
    check_algorithm(source_file.algorithm)
    dest, expected = Path(dest), source_file.checksum
    if verify_existing(dest, expected, source_file.algorithm, source_file.size, source_file.url):
        log.info("%s: already verified", dest)
        return dest
    if dest.is_file() and (old := source_file.superseded_by_this(dest.stat().st_size)):
        log.warning("%s has the size of %s; fetching the current release to replace it", dest, old.what)
    commit = _pinned_commit(source_file, dest)
    # imported here: only Hub files need them, and they add ~0.15 s to every hnclip start
    from httpx2 import HTTPError
    from huggingface_hub import hf_hub_download, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    from huggingface_hub.utils import disable_progress_bars

    url = hf_hub_url(source_file.hub_repo, source_file.name, repo_type=source_file.hub_repo_type, revision=commit)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.with_name(f".hub-{dest.name}")
    try:
        with contextlib.nullcontext() if progress else disable_progress_bars():
            fetched = hf_hub_download(source_file.hub_repo, source_file.name, repo_type=source_file.hub_repo_type,
                                      revision=commit, local_dir=staging)
        commit_verified(Path(fetched), dest, expected, source_file.algorithm, source_file.size, url)
    except ChecksumMismatch as mismatch:
        raise naming_superseded(mismatch, source_file) from None
    except LocalEntryNotFoundError as error:  # no copy anywhere: offline, unless the Hub answered with an error
        if isinstance(error.__cause__, HfHubHTTPError):
            raise _hub_error(url, error.__cause__, dest) from error
        raise OfflineError(offline_message(url, describe(error), dest, source_file.algorithm, expected)) from error
    except (HTTPError, OSError) as error:
        raise _hub_error(url, error, dest) from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


def _hub_error(url: str, error: BaseException, dest: Path) -> DownloadError:
    return DownloadError(f"could not fetch {url}: {describe(error)}. Check hub_repo and revision in "
                         f"hnclip/data/sources.py, set {MIRROR_ENV} to a mirror, or put the file at {dest} by hand.")


def _pinned_commit(source_file: SourceFile, dest: Path) -> str:
    """The full commit a Hub file is pinned to; a branch or tag could move, so anything else is refused."""
    if source_file.revision and re.fullmatch(r"[0-9a-f]{40}", source_file.revision):
        return source_file.revision
    prefix = "datasets/" if source_file.hub_repo_type == "dataset" else ""
    pin = f"{source_file.algorithm} {source_file.checksum}" if source_file.checksum else "the content you checked"
    raise DownloadError(
        f"{source_file.name} comes from the Hugging Face Hub ({prefix}{source_file.hub_repo}), but "
        f"hnclip/data/sources.py pins no commit for it (revision={source_file.revision!r}). Pin one: from "
        f"https://huggingface.co/{prefix}{source_file.hub_repo}/commits/main pick the full 40-character commit "
        f"whose {source_file.name} has {pin}, and set revision='<commit>' on its entry. Until then, set "
        f"{MIRROR_ENV} to a mirror or put the file at {dest} by hand.")
