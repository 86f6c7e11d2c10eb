"""`hnclip table` and `hnclip figure`: one table (md, tex, csv + provenance) or one figure (png, pdf).
The command of one concept at two layers: the tables and figures themselves are the package
`hnclip.report` (a table: `hnclip.report.build`)."""
from __future__ import annotations

from pathlib import Path

from hnclip.config.registry import Registry
from hnclip.errors import UnknownNameError


def build_table(reg: Registry, name: str) -> list[Path]:
    """A retrieval table of params.yaml's `tables`, or a derived one of `derived_tables` (by kind)."""
    from hnclip.report import build
    if name in reg.params["tables"]:
        return build.build_table(reg, name)
    derived = reg.params["derived_tables"].get(name)
    if derived is None:
        raise UnknownNameError(f"unknown table {name!r}; allowed values: "
                               f"{sorted([*reg.params['tables'], *reg.params['derived_tables']])}")
    if derived["kind"] == "caption_geometry":
        return build.build_caption_geometry_table(reg, name)
    return build.build_timing_table(reg, name)


def draw_figure(reg: Registry, name: str) -> list[Path]:
    from hnclip.report.figures import draw
    if name not in reg.params["figures"]:
        raise UnknownNameError(f"unknown figure {name!r}; allowed values: {sorted(reg.params['figures'])}")
    return draw(reg, name)
