"""The claims of claims.yaml as data, and the walk over a claim's statistic tree.

A statistic is a leaf (one kind: contrast, spread, trajectory, order_preserved, probe, caption_geometry,
paired_timing; see hnclip.claims.statistics) or a `difference` / `concat` of statistics."""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from hnclip.config.params import read_yaml
from hnclip.io import package_text, read_json

COMPOSITES = ("difference", "concat")  # statistics built of other statistics


@functools.lru_cache(maxsize=1)
def definitions() -> dict:
    """claims.yaml: the claims and the regime preconditions they may require."""
    return read_yaml(package_text(__package__, "claims.yaml"))  # libyaml's loader: the Snakefile reads it too


def claim_definitions() -> list[dict]:
    """Every claim of claims.yaml (quote, where, decision, statistic, requires, ...), in file order."""
    return definitions()["claims"]


# Each rule's measured specificity at the paper's test sizes (`python -m hnclip.claims.specificity`)
SPECIFICITY_FILE = Path(__file__).with_name("specificity.json")
NULL_SUPPORT_MAX = 0.10   # "supported" needs a rule that says so at most this often without the effect
SIZE_MIN = 0.90           # ... and at least this often for an exact reproduction of the paper


def rule_hash(claim: dict) -> str:
    """What a claim's verdict depends on: its statistic and decisions (not its quote or prose)."""
    rule = {key: claim.get(key) for key in ("statistic", "decision", "real_data_decision")}
    if claim.get("exact_check"):  # its denied world sits by its printed rounding
        rule["exact_check"] = claim["exact_check"]["printed_rounding"]
    return hashlib.sha256(json.dumps(rule, sort_keys=True).encode()).hexdigest()[:16]


def rule_specificity(path: Path = SPECIFICITY_FILE) -> dict[str, dict]:
    """claim_id -> its rule's size, null_support, reversed_support, note and rule_hash (empty: no file)."""
    return read_json(path)["claims"] if path.is_file() else {}


def statistic_leaves(statistic: dict) -> list[dict]:
    """The leaf statistics of a statistic's tree, in order (itself when it is a leaf)."""
    for composite in COMPOSITES:
        if composite in statistic:
            return [leaf for s in statistic[composite] for leaf in statistic_leaves(s)]
    return [statistic]


def statistic_kinds(statistic: dict) -> set[str]:
    """The kinds its leaves use (`probe` also as `probe:<measure>`)."""
    out = set()
    for leaf in statistic_leaves(statistic):
        for key, value in leaf.items():
            if isinstance(value, dict):
                out.add(key)
                if key == "probe":
                    out.add(f"probe:{value['measure']}")
    return out


def row_of(entry: str, table: str) -> tuple[str, str]:
    """`row@table` names a row of another table (e.g. plain fine-tuning from Table A4 as a companion
    claim's competitor); a plain row is one of `table`."""
    row, _, other = entry.partition("@")
    return row, other or table


def tables_named(statistic: dict) -> set[str]:
    """Every table whose cells its leaves read (a contrast's `b_table` and `row@table` competitors too)."""
    named = set()
    for leaf in statistic_leaves(statistic):
        for value in leaf.values():
            if isinstance(value, dict) and "table" in value:
                named |= {value["table"], value.get("b_table", value["table"])}
                named |= {row_of(b, value["table"])[1] for _, bs in value.get("pairs", [])
                          for b in ([bs] if isinstance(bs, str) else bs)}
    return named
