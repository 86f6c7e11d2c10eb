"""The settings of `hnclip plan`: params.yaml `planning`, overridden by the command's flags."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from hnclip.config.registry import Registry
from hnclip.errors import UserError


@dataclass(frozen=True)
class Settings:
    rates: str = "paper"              # `paper` (PAPER_RATES) or a JSON-lines file of benchmarks/throughput.py
    auxiliary_rates: str | None = None   # measured segment rates: benchmarks/results/auxiliary_throughput.jsonl
    safety_factor: float = 1.5
    startup_min: float = 15.0         # start, backbone load, data indexing, checkpoint writes
    partition_limit_min: int | None = None   # the longest time limit the partition allows
    concurrent_runs: int = 1          # runs training at once, each holding its resume area while it trains


def parse_minutes(text: str | int) -> int:
    """A time limit in minutes, written as SLURM's --time: minutes, minutes:seconds, hours:minutes:seconds,
    days-hours, days-hours:minutes or days-hours:minutes:seconds (`2880`, `48:00:00`, `2-00:00:00`)."""
    value = str(text).strip()
    if not re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", value):
        raise UserError(f"partition limit {value!r}: give minutes (2880) or SLURM's D-HH:MM:SS (2-00:00:00)")
    days, _, clock = value.rpartition("-")
    numbers = [int(part) for part in clock.split(":")]
    if days:
        hours, minutes, seconds = (numbers + [0, 0])[:3]
    elif len(numbers) == 3:
        hours, minutes, seconds = numbers
    else:
        hours, (minutes, seconds) = 0, (numbers + [0])[:2]
    return int(days or 0) * 1440 + hours * 60 + minutes + math.ceil(seconds / 60)


def settings_of(reg: Registry, rates: str | None = None, partition_limit: str | int | None = None,
                auxiliary_rates: str | None = None) -> Settings:
    """params.yaml `planning` (`partition_limit`: minutes or D-HH:MM:SS), overridden by the arguments."""
    raw = dict(reg.params.get("planning", {}))
    limit = raw.pop("partition_limit", None) if partition_limit is None else partition_limit
    raw.pop("partition_limit", None)
    settings = Settings(**raw, partition_limit_min=None if limit in (None, "") else parse_minutes(limit))
    settings = replace(settings, rates=rates) if rates else settings
    return replace(settings, auxiliary_rates=auxiliary_rates) if auxiliary_rates else settings
