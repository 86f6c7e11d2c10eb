"""Downloading a whole source: every automatic file of it (see sources.py) fetched and verified, its
manual files checked, and its archives unpacked into `<root>/<source>/extracted/`. The library side of
one concept at two layers: the command that runs it (`hnclip download`) is `hnclip.commands.download`.

The pieces: one file over HTTP with resume (http_download.py), or from the Hugging Face Hub at its
pinned commit (hub_download.py); checksum verification and `.complete` markers (verified_files.py);
archive extraction (archives.py); the errors they raise (download_errors.py).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hnclip.data.archives import extract_archive
from hnclip.data.download_errors import ArchiveError, ChecksumMismatch, ManualStepRequired, naming_superseded
from hnclip.data.http_download import download_file, retrying_session
from hnclip.data.hub_download import download_hub_file
from hnclip.data.sources import Source, SourceFile, get_source, mirror_base, resolve_url
from hnclip.data.verified_files import marker_path, verify_existing


@dataclass
class DatasetFiles:
    """What `download_dataset` left in place."""
    name: str
    dataset_dir: Path
    raw: dict[str, Path] = field(default_factory=dict)   # verified raw files by name
    pending_manual: list[str] = field(default_factory=list)

    @property
    def raw_dir(self) -> Path:
        return self.dataset_dir / "raw"

    @property
    def extracted_dir(self) -> Path:
        return self.dataset_dir / "extracted"


def download_dataset(name: str, root: str | os.PathLike, mirror: str | None = None, *,
                     source: Source | None = None, retries: int = 4, backoff: float = 1.0,
                     progress: bool = True, require_manual: bool = True) -> DatasetFiles:
    """Download every automatic file of source `name` into `root/name/raw/`, check the manual ones,
    and unpack the archives into `root/name/extracted/`.

    Hub files come through `download_hub_file` unless a mirror is set (a mirror serves every file
    at `<mirror>/<source>/<file name>`). A missing manual file is reported after everything else is
    done: its instructions go to stderr, and ManualStepRequired is raised if `require_manual` (else
    they are in `pending_manual`). `source` overrides the table entry (tests, or a mirror with its own pins).
    """
    source = source or get_source(name)
    result = DatasetFiles(name=name, dataset_dir=Path(root) / name)
    with retrying_session(retries, backoff) as session:
        for source_file in source.files:
            if source_file.manual:
                continue
            dest = result.raw_dir / source_file.name
            if source_file.hub_repo and mirror_base(mirror) is None:
                result.raw[source_file.name] = download_hub_file(source_file, dest, progress=progress)
            else:
                try:
                    result.raw[source_file.name] = download_file(
                        resolve_url(name, source_file, mirror), dest, source_file.checksum, source_file.algorithm,
                        retries=retries, backoff=backoff, progress=progress, session=session,
                        expected_size=source_file.size)
                except ChecksumMismatch as mismatch:
                    raise naming_superseded(mismatch, source_file) from None
    for source_file in source.files:
        if source_file.manual:
            _check_manual_file(source, source_file, result)
    for file_name, path in result.raw.items():
        source_file = source.file(file_name)
        if source_file.is_archive:
            _extract_source_archive(source_file, path, result.extracted_dir)
    if result.pending_manual:
        message = "\n\n".join(result.pending_manual)
        print(message, file=sys.stderr)
        if require_manual:
            raise ManualStepRequired(message)
    return result


def _check_manual_file(source: Source, source_file: SourceFile, result: DatasetFiles) -> None:
    path = result.raw_dir / source_file.name
    if path.exists():
        if not verify_existing(path, source_file.checksum, source_file.algorithm, source_file.size):
            pin = f"{source_file.algorithm} {source_file.checksum or '(unpinned)'}, size {source_file.size or '?'}"
            raise ChecksumMismatch(f"{path} (placed by hand) does not verify against sources.py ({pin}); "
                                   f"it was left in place: replace it with a good copy", source_file.checksum)
        result.raw[source_file.name] = path
    elif not (source_file.satisfied_by and _has_files(result.extracted_dir / source_file.satisfied_by)):
        result.pending_manual.append(manual_instructions(source.name, source_file, result.dataset_dir))


def manual_instructions(source_name: str, source_file: SourceFile, dataset_dir: Path) -> str:
    raw = dataset_dir / "raw" / source_file.name
    lines = [f"[{source_name}] manual step required: {source_file.name}", source_file.instructions,
             f"Then put it at {raw}"]
    pin = (f"; it is checked against {source_file.algorithm} {source_file.checksum}" if source_file.checksum
           else "; no checksum is pinned yet, the sha256 seen is recorded next to it")
    lines[-1] += pin
    if source_file.is_archive:
        lines[-1] += f" and unpacked into {dataset_dir / 'extracted' / source_file.extract_to}"
    if source_file.satisfied_by:
        lines.append(f"(or unpack it yourself so that {dataset_dir / 'extracted' / source_file.satisfied_by} "
                     f"holds the files{' ' + source_file.extract_only if source_file.extract_only else ''}).")
    lines.append("Then rerun the download.")
    return "\n".join(line for line in lines if line)


def _extract_source_archive(source_file: SourceFile, path: Path, extracted_dir: Path) -> None:
    try:
        extract_archive(path, extracted_dir, source_file.extract_to,
                        only=source_file.extract_only, flatten=source_file.flatten)
    except ArchiveError as error:
        # An archive that will not unpack is not a complete download: drop its marker, and the
        # file itself when nothing pins it (so the next run fetches it again instead of trusting it).
        marker_path(path).unlink(missing_ok=True)
        if source_file.checksum is None and not source_file.manual:
            path.unlink(missing_ok=True)
            raise ArchiveError(f"{error} {path.name} was deleted; the next run downloads it again.") from error
        raise


def _has_files(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())
