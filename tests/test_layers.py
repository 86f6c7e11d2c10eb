"""The library's structure holds: its packages stand on floors, an import only goes down the floors, and
no module reaches itself through imports (no circle, function-local imports included).

    __main__                                 `python -m hnclip`
    cli, rehearsal                           the command line and the rehearsal command
    commands                                 one module per workflow verb (`hnclip <verb>`)
    claims, plan                             the scorecard; the cost plan
    report                                   tables, figures, effects, report pages
    training                                 the fine-tuning loop
    auxiliary, evaluation                    the baselines' auxiliary inputs; retrieval evaluation
    losses                                   the objectives
    models                                   towers, adapters, Long-CLIP loading
    data, provenance                         datasets, downloads, loaders; records, lineage, audit
    config, runtime                          params, registry, paths; device, GPU slots
    io, errors, hashing, _lazy, __init__     the ground

Packages on one floor do not import each other (the ground's modules may). Imports are read from the
source (every `import`/`from ... import`). The one exception is marked in place with
`# layer-exception:`: the warm server (runtime.warm) runs the CLI, which is its whole job.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "hnclip"
FLOORS = (
    ("io", "errors", "hashing", "_lazy", "__init__"),
    ("config", "runtime"),
    ("data", "provenance"),
    ("models",),
    ("losses",),
    ("auxiliary", "evaluation"),
    ("training",),
    ("report",),
    ("claims", "plan"),
    ("commands",),
    ("cli", "rehearsal"),
    ("__main__",),
)
LAYERS = {package: floor for floor, packages in enumerate(FLOORS, 1) for package in packages}
GROUND = 1   # its modules may import one another (without a circle)
EXCEPTION_MARK = "# layer-exception:"


def top_part(module: str) -> str:
    """`hnclip.training.loop` -> `training`; `hnclip` itself -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path, package_root: Path = PACKAGE) -> str:
    parts = ["hnclip", *path.relative_to(package_root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, package_root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, absolute name) of every hnclip import in a file, relative imports resolved: the module of an
    `import` or `from` statement, and each name a `from` statement imports under it (which may be a module:
    `from hnclip.report import tables`)."""
    tree = ast.parse(path.read_text(), str(path))
    here = ["hnclip", *path.relative_to(package_root).with_suffix("").parts]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found += [(node.lineno, module)] + [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return [(line, name) for line, name in found if name.startswith("hnclip.")]


def layer_violations(package_root: Path = PACKAGE, layers: dict[str, int] = LAYERS) -> list[str]:
    problems = []
    for path in sorted(package_root.rglob("*.py")):
        rel = path.relative_to(package_root)
        own = rel.parts[0].removesuffix(".py")
        if own not in layers:
            problems.append(f"{rel}: its package {own!r} has no floor in this test's table")
            continue
        lines = path.read_text().splitlines()
        seen = set()
        for line, name in imported_modules(path, package_root):
            target = top_part(name)
            if target == own or (line, target) in seen:
                continue
            seen.add((line, target))
            if target not in layers:
                problems.append(f"{rel}:{line}: imports hnclip.{target}, which has no floor here")
                continue
            upward = layers[target] > layers[own] or (layers[target] == layers[own] != GROUND)
            if upward and EXCEPTION_MARK not in lines[line - 1]:
                problems.append(f"{rel}:{line}: {own} (floor {layers[own]}) imports hnclip.{target} "
                                f"(floor {layers[target]})")
    return problems


def import_graph(package_root: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the modules of the package it imports (a name imported from a package counts as its
    module where it is one, else as the package's __init__)."""
    modules = {module_name(p, package_root): p for p in package_root.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for _, module in imported_modules(path, package_root):
            while module not in modules and "." in module:
                module = module.rsplit(".", 1)[0]
            if module in modules and module != name:
                targets.add(module)
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted; [] when acyclic.
    A package's __init__ importing its own modules is how a package exports them, not a circle."""
    graph = {m: {t for t in ts if not (m == t.rsplit(".", 1)[0] and m in graph)} for m, ts in graph.items()}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_module_imports_up_the_floors():
    assert layer_violations() == []


def test_no_circle_anywhere_in_the_library():
    assert circles(import_graph()) == []


def test_every_package_has_a_floor():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert packages <= set(LAYERS)


def test_the_only_exception_is_the_warm_server():
    marked = sorted({str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     if EXCEPTION_MARK in p.read_text()})
    assert marked == ["runtime/warm.py"]


@pytest.mark.parametrize("source, expected", [
    ("from hnclip.training.loop import train\n", "1: losses (floor 5) imports hnclip.training (floor 7)"),
    ("def f():\n    from ..commands import data\n", "2: losses (floor 5) imports hnclip.commands (floor 10)"),
    ("from hnclip import cli\n", "1: losses (floor 5) imports hnclip.cli (floor 11)"),
    ("from hnclip.auxiliary.batches import x\n", "1: losses (floor 5) imports hnclip.auxiliary (floor 6)"),
    ("from hnclip.hashing import json_sha256\nfrom .contrastive import hn_loss\nfrom hnclip.models import towers\n",
     None),
])
def test_an_upward_import_is_caught(tmp_path, source, expected):
    (tmp_path / "losses").mkdir()
    (tmp_path / "losses" / "bad.py").write_text(source)
    assert layer_violations(tmp_path) == ([f"losses/bad.py:{expected}"] if expected else [])


def test_a_peer_import_is_caught_but_not_on_the_ground(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.py").write_text("from hnclip.provenance.records import x\n")
    (tmp_path / "io.py").write_text("from hnclip.hashing import json_sha256\n")
    assert layer_violations(tmp_path) == ["data/a.py:1: data (floor 3) imports hnclip.provenance (floor 3)"]


def test_a_circle_is_caught(tmp_path):
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "__init__.py").write_text("from hnclip.report import c\n")
    (tmp_path / "report" / "a.py").write_text("def f():\n    from hnclip.report.b import g\n")
    (tmp_path / "report" / "b.py").write_text("from hnclip.report import a\n")
    (tmp_path / "report" / "c.py").write_text("from hnclip.report.a import f\n")
    assert circles(import_graph(tmp_path)) == [["hnclip.report.a", "hnclip.report.b"]]


def test_the_plan_imports_no_torch():
    """The Snakefile imports the plan to book each job's time limit: importing torch there would cost every
    `snakemake` invocation seconds (and a CUDA initialisation on a login node)."""
    import subprocess
    import sys
    code = "import sys, hnclip.plan.cost_plan, hnclip.plan.printout; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
