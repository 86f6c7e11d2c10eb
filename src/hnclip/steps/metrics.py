"""`hnclip metrics`: results/metrics.json (headline numbers, what `dvc metrics show/diff` and
`dvc exp show` display), results/plots/convergence.csv (the convergence curves `dvc plots show`
draws) and results/metrics.provenance.json (what both were computed from)."""
from __future__ import annotations

import time
from pathlib import Path

from hnclip import provenance
from hnclip.config.registry import Registry
from hnclip.io import write_json, write_text
from hnclip.report import metrics


def write_metrics(reg: Registry) -> list[Path]:
    """Write the metrics, the convergence curves and their provenance; return their paths."""
    started = time.time()
    write_json(metrics.METRICS, metrics.headline_metrics(reg))
    write_text(metrics.CONVERGENCE, metrics.convergence_rows(reg).to_csv(index=False))
    written = [metrics.METRICS, metrics.CONVERGENCE]
    record = provenance.record(
        "metrics", inputs=metrics.inputs(reg), wall_time_s=time.time() - started,
        params={"profile": reg.profile_name, "headline_methods": list(metrics.HEADLINE_METHODS),
                "headline_selection": metrics.HEADLINE_SELECTION, "seeds": reg.profile["seeds"]},
        extra={"outputs": {str(p): provenance.file_sha256(p) for p in written}})
    write_json(metrics.PROVENANCE, record)
    return written + [metrics.PROVENANCE]
