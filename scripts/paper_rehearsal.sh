#!/usr/bin/env bash
# The paper profile's rehearsal, end to end: builds the loopback mirror of real-format miniatures, places
# DCI's SA-1B shard by hand, runs `snakemake --config profile=paper_rehearsal` to the end (every table,
# figure, effects table, scorecard and metric) and stops the mirror. Arguments after `--` go to Snakemake.
#   scripts/paper_rehearsal.sh [--cores N] [-- SNAKEMAKE ARGS]
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m hnclip.rehearsal "$@"
