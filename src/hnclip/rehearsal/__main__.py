"""`python -m hnclip.rehearsal [--cores N] [-- SNAKEMAKE ARGS]`: the paper profile's rehearsal, end to end.
`python -m hnclip.rehearsal pins`: the miniatures' pins, as hnclip/data/rehearsal_sources.py holds them."""
from __future__ import annotations

import argparse
import hashlib
import sys


def print_pins() -> int:
    from hnclip.rehearsal.mirror import miniatures
    print("REHEARSAL_PINS: dict[str, dict[str, tuple[str, int]]] = {")
    for source, files in miniatures().items():
        print(f"    {source!r}: {{")
        for name, data in files.items():
            line = f"        {name!r}: ({hashlib.sha256(data).hexdigest()!r}, {len(data)}),"
            print(line if len(line) <= 120 else line.replace(": (", ":\n            (", 1))
        print("    },")
    print("}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pins"]:
        return print_pins()
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m hnclip.rehearsal", description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=int, default=2, help="Snakemake's --cores (default 2)")
    parser.add_argument("--project", default=".", help="the project checkout to run in (default: here)")
    args = parser.parse_args(own)
    from hnclip.rehearsal.command import run_rehearsal
    return run_rehearsal(args.project, cores=args.cores, extra=extra).returncode


if __name__ == "__main__":
    sys.exit(main())
