"""`hnclip effects` and `hnclip claims`: one table's contrasts with their intervals
(results/effects/<table>.*), and the claims scorecard (results/claims.csv, results/claims.md). The
command of one concept at two layers: the scorecard itself is the package `hnclip.claims` (the contrasts:
`hnclip.report.effects`)."""
from __future__ import annotations

from pathlib import Path

from hnclip.config.registry import Registry
from hnclip.errors import UnknownNameError


def build_effects(reg: Registry, table: str) -> list[Path]:
    from hnclip.report.effects import build_effects as build
    if table not in reg.params["tables"]:
        raise UnknownNameError(f"unknown table {table!r}; allowed values: {sorted(reg.params['tables'])}")
    return build(reg, table)


def build_claims(reg: Registry) -> list[Path]:
    from hnclip.claims.scorecard import build_claims as build
    return build(reg)
