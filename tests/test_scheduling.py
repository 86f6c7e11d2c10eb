"""How the suite is spread over xdist workers (helpers.scheduling): the modules that take a shared
session fixture form one work unit, found from their test functions' parameters."""
from pathlib import Path
from types import SimpleNamespace

from helpers.scheduling import (
    LONGEST_FIRST,
    SHARED_SESSION_FIXTURES,
    grouped_file_scheduling,
    modules_taking,
    work_unit_of_module,
)

TESTS = Path(__file__).resolve().parent


def test_modules_taking_a_fixture_are_found_from_their_parameters(tmp_path):
    (tmp_path / "test_a.py").write_text("def test_x(micro_project, tmp_path):\n    pass\n")
    (tmp_path / "test_b.py").write_text("import pytest\n\n@pytest.fixture\ndef project(micro_project):\n"
                                        "    return micro_project\n\ndef test_y(project):\n    pass\n")
    (tmp_path / "test_c.py").write_text("def test_z(tmp_path):\n    micro_project = 1\n")
    (tmp_path / "helper.py").write_text("def f(micro_project):\n    pass\n")  # not a test module
    assert modules_taking("micro_project", tmp_path) == {"test_a.py", "test_b.py"}
    assert work_unit_of_module(tmp_path) == {"test_a.py": "micro_project", "test_b.py": "micro_project"}


def test_the_suites_micro_project_modules_share_one_work_unit():
    takers = modules_taking("micro_project")
    assert {"test_lineage_audit.py", "test_run_evaluation.py"} <= takers
    assert SHARED_SESSION_FIXTURES == ("micro_project",)
    two_workers = SimpleNamespace(getvalue=lambda name: {"tx": ["2*popen"]}[name])  # what `-n 2` sets
    scheduler = grouped_file_scheduling(two_workers, None)
    assert scheduler.numnodes == 2
    scopes = {name: scheduler._split_scope(f"tests/{name}::test_case") for name in (*takers, "test_cli.py")}
    assert len({scopes[name] for name in takers}) == 1
    assert scopes["test_cli.py"] == "tests/test_cli.py"  # every other module is its own unit


def test_the_longest_modules_named_first_exist():
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    assert [name for name in LONGEST_FIRST if not (TESTS / name).is_file()] == []
