"""Lazy package exports (PEP 562): `from hnclip.models import load_longclip` works, while importing a
package stays cheap (the Snakefile imports the registry without torch)."""
from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """(__getattr__, __dir__) for `package`, resolving each exported name from its module on first use."""
    def __getattr__(name: str) -> object:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted([*vars(importlib.import_module(package)), *exports])
    return __getattr__, __dir__
