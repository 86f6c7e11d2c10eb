"""`hnclip download`: fetch and verify one source (resumable, checksummed), with its record."""
from __future__ import annotations

import time
from pathlib import Path

from hnclip import provenance
from hnclip.config import paths
from hnclip.config.registry import Registry
from hnclip.io import write_json


def download_source(reg: Registry, source: str, mirror: str | None = None) -> Path:
    """Download `source` into the profile's data root; returns the directory of verified files."""
    from hnclip.data.download import download_dataset
    started = time.time()
    files = download_dataset(source, Path(reg.profile["data_root"]), mirror=mirror)
    record = provenance.record("download", inputs={f"raw:{name}": path for name, path in files.raw.items()},
                               wall_time_s=time.time() - started, extra={"source": source})
    write_json(paths.download_record(reg.profile["data_root"], source), record)
    return files.raw_dir
