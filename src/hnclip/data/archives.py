"""Safe, atomic archive extraction (.tar, .tar.gz, .zip).

Each archive is unpacked into a temporary folder first, then moved into place, merging with what
is there, and its marker in `<extracted>/.complete/` is written last. A member path that is absolute
or climbs out with '..' is refused, never silently rewritten; links and devices are never unpacked.
"""
from __future__ import annotations

import fnmatch
import logging
import os
import re
import shutil
import tarfile
import tempfile
import zipfile
import zlib
from pathlib import Path

from hnclip.data.download_errors import ArchiveError, describe
from hnclip.data.verified_files import recorded_sha256
from hnclip.io import read_json, write_json

log = logging.getLogger(__name__)

CHUNK = 1 << 20  # copying archive members


def extract_archive(archive: str | os.PathLike, extracted_dir: str | os.PathLike, subdir: str = "", *,
                    only: str | None = None, flatten: bool = False) -> Path:
    """Unpack a .tar/.tar.gz/.zip into `extracted_dir/subdir`, merging with what is there.

    Skipped if this archive (same sha256) was already unpacked there. Raises ArchiveError on a
    corrupt archive or an unsafe member path; the temporary folder is removed and no marker written.
    """
    archive, extracted_dir = Path(archive), Path(extracted_dir)
    target = extracted_dir / subdir
    marker = extracted_dir / ".complete" / f"{archive.name}.json"
    archive_sha256 = recorded_sha256(archive)
    if _extraction_done(marker, archive_sha256, subdir, target):
        return target
    extracted_dir.mkdir(parents=True, exist_ok=True)
    for stale in extracted_dir.glob(f".extracting-{archive.name}-*"):  # left by a killed run
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".extracting-{archive.name}-", dir=extracted_dir))
    try:
        _unpack(archive, staging, only, flatten)
        count = sum(1 for path in staging.rglob("*") if path.is_file())
        _merge_move(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    write_json(marker, {"archive": archive.name, "sha256": archive_sha256, "subdir": subdir, "files": count})
    log.info("unpacked %d files from %s into %s", count, archive.name, target)
    return target


def _extraction_done(marker: Path, archive_sha256: str, subdir: str, target: Path) -> bool:
    try:
        done = read_json(marker)
    except (FileNotFoundError, ValueError):
        return False
    return done.get("sha256") == archive_sha256 and done.get("subdir") == subdir and target.is_dir()


def _unpack(archive: Path, staging: Path, only: str | None, flatten: bool) -> None:
    try:
        if archive.name.endswith(".zip"):
            _unpack_zip(archive, staging, only, flatten)
        else:
            with tarfile.open(archive, "r:*") as tar:
                tar.extractall(staging, filter=_tar_filter(only, flatten))
    except ArchiveError:
        raise
    except tarfile.FilterError as error:  # before TarError: it is one
        raise ArchiveError(f"{archive}: unsafe member path {error.tarinfo.name!r} ({error}); "
                           f"refusing to unpack this archive") from error
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, OSError) as error:
        raise ArchiveError(f"cannot unpack {archive}: {describe(error)}. The archive is corrupt or "
                           f"incomplete; nothing was marked as extracted.") from error


def _tar_filter(only: str | None, flatten: bool):
    """tarfile's "data" filter (refuses members that would land outside the folder, drops unsafe
    modes), kept to regular files matching `only`, renamed to their base name if `flatten`."""
    def keep(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        if not member.isfile():  # folders are implied; links and devices are never unpacked
            return None
        filtered = tarfile.data_filter(member, dest)
        if filtered.name != member.name:  # the filter would make an absolute name relative: refuse, as for zips
            raise tarfile.AbsolutePathError(member)
        if not _wanted(member.name, only):
            return None
        return filtered.replace(name=member.name.rsplit("/", 1)[-1], deep=False) if flatten else filtered
    return keep


def _unpack_zip(archive: Path, staging: Path, only: str | None, flatten: bool) -> None:
    with zipfile.ZipFile(archive) as bundle:
        for info in bundle.infolist():
            name = safe_member_path(info.filename, archive)
            if info.is_dir() or not _wanted(name, only):
                continue
            with bundle.open(info) as source:  # raises BadZipFile on a CRC error
                _write_member(source, staging, name, flatten)


def safe_member_path(name: str, archive: Path | str = "archive") -> str:
    """A zip member's path, normalised; ArchiveError if it is absolute or climbs out with '..'.

    Kept by hand: zipfile has no refusing counterpart of tarfile's data filter (its extract() silently
    rewrites such names, which would hide a malicious archive), and `only`/`flatten` need the name."""
    normalised = name.replace("\\", "/")
    parts = [part for part in normalised.split("/") if part not in ("", ".")]
    if normalised.startswith("/") or re.match(r"^[A-Za-z]:", normalised) or ".." in parts:
        raise ArchiveError(f"{archive}: unsafe member path {name!r} (absolute or climbing out with '..'); "
                           f"refusing to unpack this archive")
    return "/".join(parts)


def _wanted(name: str, only: str | None) -> bool:
    return bool(name) and (only is None or fnmatch.fnmatch(name.rsplit("/", 1)[-1], only))


def _write_member(source, staging: Path, name: str, flatten: bool) -> None:
    out = staging / (name.rsplit("/", 1)[-1] if flatten else name)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as handle:
        shutil.copyfileobj(source, handle, CHUNK)


def _merge_move(source: Path, target: Path) -> None:
    """Move everything under `source` into `target`, keeping what `target` already holds
    (e.g. photos placed there by hand); files of the same name are replaced."""
    target.mkdir(parents=True, exist_ok=True)
    for child in source.iterdir():
        destination = target / child.name
        if child.is_dir() and destination.is_dir():
            _merge_move(child, destination)
        elif destination.is_dir():
            raise ArchiveError(f"cannot unpack file {child.name!r}: {destination} is a folder")
        else:
            if child.is_dir() and destination.exists():
                destination.unlink()
            os.replace(child, destination)
