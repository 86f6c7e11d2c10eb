"""Datasets: manifests (the one split format), synthetic benchmarks, real-data downloads and builders,
training pairs, worker-process loading and overlap checks (the baselines' auxiliary inputs are
`hnclip.auxiliary`). The library side of one concept at two layers: the command that materialises a
dataset role (`hnclip data`) is `hnclip.commands.data`."""

from hnclip._lazy import lazy_exports

_EXPORTS = {
    "read_manifest": "hnclip.data.manifest",
    "write_manifest": "hnclip.data.manifest",
    "ManifestRow": "hnclip.data.manifest",
    "PairDataset": "hnclip.data.loader",
    "subset_indices": "hnclip.data.loader",
    "write_dataset": "hnclip.data.synthetic",
    "download_dataset": "hnclip.data.download",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
