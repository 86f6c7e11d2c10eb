"""`hnclip download`: fetch and verify one source (resumable, checksummed), with its record. The command
of one concept at two layers: the library side that downloads is `hnclip.data.download`."""
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
    from hnclip.data.source_tables import profile_source
    from hnclip.data.verified_files import verification_facts
    started = time.time()
    files = download_dataset(source, Path(reg.profile["data_root"]), mirror=mirror,
                             source=profile_source(reg.profile, source))  # the profile's table and pins
    record = provenance.record("download", inputs={f"raw:{name}": path for name, path in files.raw.items()},
                               wall_time_s=time.time() - started,
                               extra={"source": source,  # per file: sha256, and pinned or recorded on first download
                                      "files": {name: verification_facts(path) for name, path in files.raw.items()}})
    write_json(paths.download_record(reg.profile["data_root"], source), record)
    return files.raw_dir
