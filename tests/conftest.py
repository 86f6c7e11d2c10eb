import copy
import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("DVC_NO_ANALYTICS", "1")


@pytest.fixture(scope="session")
def project_root() -> Path:
    return ROOT


@pytest.fixture
def params() -> dict:
    """A fresh copy of the committed params.yaml."""
    return copy.deepcopy(yaml.safe_load((ROOT / "params.yaml").read_text()))


@pytest.fixture
def in_project(monkeypatch):
    monkeypatch.chdir(ROOT)
    return ROOT
