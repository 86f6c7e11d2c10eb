"""Provenance: content hashes (`hashing`), the record every artifact carries (`records`), and the
two ways back from a number to its sources (`lineage`, `audit`)."""
from hnclip.hashing import (
           canonical_json,
           file_sha256,
           sha256_bytes,
           sha256_file,
           weights_digest,
)
from hnclip.provenance.records import code_name, git_state, input_hashes, library_versions, record

__all__ = ["canonical_json", "file_sha256", "sha256_bytes", "sha256_file", "weights_digest",
           "code_name", "git_state", "input_hashes", "library_versions", "record"]
