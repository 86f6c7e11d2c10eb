"""The code base is ruff-clean (lint + import order, settings in pyproject.toml)."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def test_ruff_is_clean_on_src_tests_and_benchmarks(project_root: Path):
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: it is pinned in requirements.lock (run ./setup.sh)")
    result = subprocess.run([ruff, "check", "src", "tests", "benchmarks", "scripts"], cwd=project_root,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:]
