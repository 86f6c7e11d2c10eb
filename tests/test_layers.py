"""The package's layers hold: a module imports only its own layer, its peers and the layers below.

    cli, __main__, rehearsal  ->  steps  ->  training / evaluation / report / provenance
    ->  data / models / losses  ->  config / runtime  ->  io / errors / hashing / _lazy (ground)

Imports are read from the source (every `import`/`from ... import`, function-local ones included).
The one exception is marked in place with `# layer-exception:`: the warm server (runtime.warm) runs
the CLI, which is its whole job.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "hnclip"
LAYERS = {
    "cli": 6, "__main__": 6, "rehearsal": 6,   # rehearsal: a command that runs the whole workflow
    "steps": 5,
    "training": 4, "evaluation": 4, "report": 4, "provenance": 4,
    "data": 3, "models": 3, "losses": 3,
    "config": 2, "runtime": 2,
    "io": 1, "errors": 1, "hashing": 1, "_lazy": 1, "__init__": 1,
}
EXCEPTION_MARK = "# layer-exception:"


def top_part(module: str) -> str:
    """`hnclip.training.loop` -> `training`; `hnclip` itself -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(path: Path, package_root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, absolute module) of every hnclip import in a file, relative imports resolved."""
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
            # `from hnclip import cli` names a module in the imported name
            names = [f"{module}.{a.name}" for a in node.names] if module == "hnclip" else [module]
            found += [(node.lineno, name) for name in names]
    return [(line, name) for line, name in found if name == "hnclip" or name.startswith("hnclip.")]


def layer_violations(package_root: Path = PACKAGE, layers: dict[str, int] = LAYERS) -> list[str]:
    problems = []
    for path in sorted(package_root.rglob("*.py")):
        rel = path.relative_to(package_root)
        own = rel.parts[0].removesuffix(".py")
        if own not in layers:
            problems.append(f"{rel}: its package {own!r} has no layer in this test's table")
            continue
        lines = path.read_text().splitlines()
        for line, module in imported_modules(path, package_root):
            target = top_part(module)
            if target not in layers:
                problems.append(f"{rel}:{line}: imports {module}, whose package has no layer here")
            elif layers[target] > layers[own] and EXCEPTION_MARK not in lines[line - 1]:
                problems.append(f"{rel}:{line}: {own} (layer {layers[own]}) imports {module} "
                                f"(layer {layers[target]})")
    return problems


def test_no_module_imports_a_higher_layer():
    assert layer_violations() == []


def test_the_only_exception_is_the_warm_server():
    marked = sorted({str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     if EXCEPTION_MARK in p.read_text()})
    assert marked == ["runtime/warm.py"]


@pytest.mark.parametrize("source, expected", [
    ("from hnclip.training.loop import train\n", ["losses/bad.py:1: losses (layer 3) imports hnclip.training.loop"]),
    ("def f():\n    from ..steps import data\n", ["losses/bad.py:2: losses (layer 3) imports hnclip.steps"]),
    ("from hnclip import cli\n", ["losses/bad.py:1: losses (layer 3) imports hnclip.cli"]),
    ("from hnclip.hashing import json_sha256\nfrom .contrastive import hn_loss\n", []),
])
def test_an_upward_import_is_caught(tmp_path, source, expected):
    (tmp_path / "losses").mkdir()
    (tmp_path / "losses" / "bad.py").write_text(source)
    problems = layer_violations(tmp_path)
    assert [p.rsplit(" (layer", 1)[0] for p in problems] == expected
