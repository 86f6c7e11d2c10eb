"""`hnclip subsets`: the nested training subsets of the data-fraction study, written for audit."""
from __future__ import annotations

from pathlib import Path

from hnclip import provenance
from hnclip.config import paths
from hnclip.config.registry import Registry
from hnclip.io import write_json

SUBSET_SEED = 0  # one permutation for every method and run seed (hnclip.data.loader.subset_indices)


def write_subsets(reg: Registry, dataset: str) -> tuple[Path, dict[str, list[str]]]:
    """Ids of every training fraction a table asks for (and 100 %); returns (path, fraction -> ids)."""
    from hnclip.data.loader import subset_indices
    from hnclip.data.manifest import read_manifest
    manifest = reg.train_manifest(dataset)
    rows = read_manifest(manifest, check_images=False)
    fractions = sorted({float(dict(c.settings).get("fraction", 1.0)) for t in reg.tables for c in reg.cells(t)
                        if c.train_set == dataset} | {1.0})
    chosen = {f"{f:g}": [rows[i].id for i in subset_indices(len(rows), f, SUBSET_SEED)] for f in fractions}
    for small, large in zip(fractions, fractions[1:]):  # nested by construction; checked anyway
        if not set(chosen[f"{small:g}"]) <= set(chosen[f"{large:g}"]):
            raise RuntimeError(f"{dataset}: the {small:g} subset is not inside the {large:g} subset")
    record = provenance.record("subsets", inputs={"train_manifest": manifest},
                               extra={"dataset": dataset, "subset_seed": SUBSET_SEED, "subsets": chosen})
    out = paths.subsets(reg.profile["data_root"], dataset)
    write_json(out, record)
    return out, chosen
