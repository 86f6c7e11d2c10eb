"""Archives in memory, byte-identical from one build to the next (fixed times, owners and modes), so
that the rehearsal's miniatures can be pinned by sha256. The tests build their fixtures with them too."""
from __future__ import annotations

import gzip
import io
import tarfile
import zipfile
from typing import Mapping

FIXED_MTIME = 1_700_000_000          # 2023-11-14: any fixed time keeps the bytes stable
FIXED_ZIP_TIME = (2023, 11, 14, 0, 0, 0)


def _tar_into(fileobj, members: Mapping[str, bytes]) -> None:
    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), FIXED_MTIME, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))


def tar_bytes(members: Mapping[str, bytes]) -> bytes:
    """An uncompressed tar (as SA-1B's shards are) of `members` (member name -> bytes), in order."""
    buffer = io.BytesIO()
    _tar_into(buffer, members)
    return buffer.getvalue()


def tar_gz(members: Mapping[str, bytes]) -> bytes:
    """A gzipped tar of `members`; the gzip header carries no file name and a zero time."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", filename="", mtime=0) as zipped:
        _tar_into(zipped, members)
    return buffer.getvalue()


def zip_bytes(members: Mapping[str, bytes], compress: bool = False) -> bytes:
    """A zip of `members` (stored, or deflated with `compress`)."""
    buffer = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(buffer, "w") as bundle:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=FIXED_ZIP_TIME)
            info.compress_type = method
            info.external_attr = 0o644 << 16
            bundle.writestr(info, data)
    return buffer.getvalue()
