"""What a download or an extraction that did not end in a verified file raises, and the wording its
messages share: an error in one line, the advice when the host cannot be reached, and the name of a
superseded upload when a checksum mismatch is one."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hnclip.errors import UserError

if TYPE_CHECKING:
    from hnclip.data.sources import SourceFile


class DownloadError(UserError, RuntimeError):
    """A download or extraction that did not end in a verified file."""


class OfflineError(DownloadError):
    """The host could not be reached at all (connection refused, DNS failure, connect timeout)."""


class ChecksumMismatch(DownloadError):
    def __init__(self, message: str, expected: str | int | None = None, got: str | int | None = None):
        super().__init__(message)
        self.expected = expected
        self.got = got


class ManualStepRequired(DownloadError):
    """A file that cannot be fetched automatically (licence click-through) is not in place yet."""


class ArchiveError(DownloadError):
    """An archive that cannot be unpacked safely: corrupt, truncated, or with unsafe member paths."""


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def offline_message(what: str, reason: str, dest: Path, algorithm: str, expected: str | None) -> str:
    return (f"could not reach the host of {what} ({reason}). We seem to be offline (or the host is down). "
            f"Fetch the file by hand and put it at {dest}" + (f" ({algorithm} {expected})" if expected else "")
            + "; the next run verifies it and carries on.")


def naming_superseded(mismatch: ChecksumMismatch, source_file: SourceFile) -> ChecksumMismatch:
    """The mismatch, saying what the file is when its checksum or size is that of an upload the
    source table marks superseded, and where the current release is."""
    old = source_file.superseded_by_this(mismatch.got)
    if old is None:
        return mismatch
    where = f" ({source_file.url})" if source_file.url else ""
    return ChecksumMismatch(f"{mismatch}. This is {old.what}. Use the current release{where}: "
                            f"{source_file.algorithm} {source_file.checksum}", mismatch.expected, mismatch.got)
