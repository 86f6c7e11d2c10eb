"""One name, one concept: two modules of the library (a package counts by its folder's name) share a name only
when they are the same concept at two layers (a workflow command and the library it calls, the training and
the loss side of multi-process training, …), and then the first paragraph of each one's docstring names the
other's dotted module path, so that a reader who opens either finds the other. Two different concepts get
two names. `__init__` and `__main__` files are not names of their own."""
from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "hnclip"


def module_names(package_root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module path -> its file (a package: its __init__.py); __main__ files are left out."""
    modules = {}
    for path in sorted(package_root.rglob("*.py")):
        parts = ["hnclip", *path.relative_to(package_root).with_suffix("").parts]
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def first_paragraph(path: Path) -> str:
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), str(path))) or ""
    return " ".join(docstring.split("\n\n")[0].split())


def names(text: str, module: str) -> bool:
    """Whether `text` names `module` itself (`hnclip.data`, not only `hnclip.data.download`)."""
    return re.search(rf"(?<![\w.]){re.escape(module)}(?!\.?\w)", text) is not None


def shared_name_problems(package_root: Path = PACKAGE) -> list[str]:
    by_name: dict[str, list[str]] = defaultdict(list)
    modules = module_names(package_root)
    for module in modules:
        by_name[module.rsplit(".", 1)[-1]].append(module)
    problems = []
    for name, group in sorted(by_name.items()):
        if len(group) < 2:
            continue
        for module in group:
            paragraph = first_paragraph(modules[module])
            for other in group:
                if other != module and not names(paragraph, other):
                    problems.append(f"{module} shares the name {name!r} with {other}, which the first paragraph of "
                                    f"its docstring does not name: the same concept at two layers names the "
                                    f"other there; a different concept takes another name")
    return problems


def test_modules_that_share_a_name_name_each_other():
    assert shared_name_problems() == []


def test_the_name_check_flags_an_unexplained_shared_name_and_accepts_an_explained_one(tmp_path):
    root = tmp_path / "hnclip"
    for folder in ("data", "commands", "training", "losses"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text('"""A package."""\n')
    (root / "__main__.py").write_text('"""python -m hnclip"""\n')
    (root / "data" / "__main__.py").write_text('"""python -m hnclip.data"""\n')
    (root / "data" / "overlap.py").write_text('"""Overlap, the library: see `hnclip.commands.overlap`."""\n')
    (root / "commands" / "overlap.py").write_text('"""`hnclip overlap`.\n\nIts library: hnclip.data.overlap."""\n')
    (root / "training" / "distributed.py").write_text('"""Ranks; the losses: hnclip.losses.distributed."""\n')
    (root / "losses" / "distributed.py").write_text('"""Gathered losses; the ranks: hnclip.training.distributed."""\n')
    problems = shared_name_problems(root)
    # the command names its library only in its second paragraph: flagged; the rest name each other
    assert problems == [problems[0]] and problems[0].startswith("hnclip.commands.overlap shares the name 'overlap' "
                                                                 "with hnclip.data.overlap")
    (root / "commands" / "data.py").write_text('"""`hnclip data`: see hnclip.data.overlap."""\n')
    flagged = {problem.split(" shares")[0] for problem in shared_name_problems(root)}
    # a package and a module share `data`: naming one of the package's modules is not naming the package
    assert flagged == {"hnclip.commands.overlap", "hnclip.commands.data", "hnclip.data"}
