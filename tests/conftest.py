"""Fixtures shared by several test modules (plain helpers are in tests/helpers/)."""
import copy
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers.fault_server import running_server
from helpers.micro_project import build_micro_project, verify_weights
from helpers.scheduling import LONGEST_FIRST, grouped_file_scheduling

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("DVC_NO_ANALYTICS", "1")


def pytest_configure(config):
    config.option.loadscopereorder = False  # what --no-loadscope-reorder sets (pytest-xdist's --dist loadfile)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: plain `pytest` runs without xdist's plugin too
def pytest_xdist_make_scheduler(config, log):
    """Under `--dist loadfile`, the modules of a shared session fixture are one work unit
    (helpers.scheduling); other modes keep xdist's own scheduler."""
    if config.getvalue("dist") == "loadfile":
        return grouped_file_scheduling(config, log)
    return None


def pytest_collection_modifyitems(items):
    """The longest modules first (helpers.scheduling.LONGEST_FIRST)."""
    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)  # stable: the default order within and after the long modules


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


@pytest.fixture
def empty_project(tmp_path, monkeypatch, params) -> Path:
    """A project with nothing built (params.yaml, and the workflow its schema is read from) as the
    working directory."""
    (tmp_path / "workflow").symlink_to(ROOT / "workflow")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> dict[str, Path]:
    """A small synthetic DOCCI (48 train, 24 test pairs): manifest paths by split. Read-only."""
    from hnclip.data.synthetic import write_dataset  # here: conftest stays cheap to import
    root = tmp_path_factory.mktemp("data")
    return write_dataset(root / "docci", "docci", {"train": 48, "test": 24}, seed=3)


@pytest.fixture
def server():
    """A local fault-injecting HTTP server (helpers.fault_server), one per test."""
    with running_server() as state:
        yield state


@pytest.fixture(scope="session")
def micro_project(tmp_path_factory) -> Iterator[Path]:
    """A real micro project with Tables 3a, 1 and 3c built (helpers.micro_project), once per session.
    Read-only: tests that change anything work on a `copy_project` of it."""
    proj = build_micro_project(tmp_path_factory.mktemp("micro") / "proj")
    yield proj
    verify_weights(proj)


@pytest.fixture
def probed_project(params, tmp_path, monkeypatch):
    """The committed params' Fig. 4 and Fig. A8 runs with hand-made probe logs and training records
    (tests/helpers/gradient_logs.py), in an empty project directory."""
    from helpers.gradient_logs import write_probed_project

    from hnclip.config.registry import Registry
    reg = Registry(params)  # validated against the project's schema before leaving the project
    monkeypatch.chdir(tmp_path)
    return write_probed_project(reg, params)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny shapes run fastest on one thread, and do not crawl when other processes share the CPUs
    (modules opt in with `pytestmark = pytest.mark.usefixtures("one_thread")`)."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_state() -> dict:
    """The weights of a randomly initialised hnclip-tiny (seed 0); load them with helpers.batches.tiny_model."""
    import torch

    from hnclip.models.factory import create
    torch.manual_seed(0)
    return create("hnclip-tiny").model.state_dict()
