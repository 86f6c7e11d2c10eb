"""Which source table a profile downloads from and verifies against: a profile's `source_table`
(params.yaml). `public` (the default) is the real one, `hnclip.data.sources`; `rehearsal` is the
rehearsal's table of miniatures (`hnclip.data.rehearsal_sources`): the same files under the same
names, with the miniatures' own pins, fetched only from a mirror. A profile never mixes them."""
from __future__ import annotations

from typing import Mapping

from hnclip.data.sources import SOURCES, Source, UnknownSourceError

PUBLIC = "public"
REHEARSAL = "rehearsal"
TABLES = (PUBLIC, REHEARSAL)


def source_table(name: str = PUBLIC) -> dict[str, Source]:
    if name == PUBLIC:
        return SOURCES
    if name == REHEARSAL:
        from hnclip.data.rehearsal_sources import rehearsal_sources
        return rehearsal_sources()
    raise UnknownSourceError(f"unknown source table {name!r}; known: {list(TABLES)}")


def table_name(profile: Mapping) -> str:
    """The source table a profile (params.yaml `profiles.<name>`) uses."""
    return profile.get("source_table", PUBLIC)


def profile_source(profile: Mapping, source: str) -> Source:
    """Source `source` as the profile's table has it."""
    table = source_table(table_name(profile))
    try:
        return table[source]
    except KeyError:
        raise UnknownSourceError(f"unknown source {source!r}; known: {sorted(table)}") from None


def pins(profile: Mapping, source: str) -> dict[str, list]:
    """{file name: [algorithm, checksum]} of a source under the profile's table: the download rules'
    params, so that a changed pin fetches and verifies the files again instead of failing at load."""
    return {f.name: [f.algorithm, f.checksum] for f in profile_source(profile, source).files}


def pinned_weights_sha256(profile: Mapping, source: str, file_name: str) -> str | None:
    """The sha256 a model file of `source` must have under the profile's table (None: unpinned)."""
    entry = profile_source(profile, source).file(file_name)
    return entry.checksum if entry.algorithm == "sha256" else None
