"""`hnclip` on user errors and bugs: every known user error (bad params, an unknown name, a bad --set,
a table not built yet, a failed download, a stale artifact) prints one line "error: <cause>" on
stderr and exits 2; any other exception is a bug and keeps its traceback. The errors are real (a bad
params.yaml, a server sending wrong bytes, a replaced checkpoint), not raised by hand, so each case
also checks the code path.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from hnclip.cli import build_parser, main
from hnclip.config.params import load_params
from hnclip.config.registry import Registry


def one_error_line(argv: list[str], capsys, progress: bool = False) -> str:
    """Run `hnclip <argv>`; it must exit 2 with exactly one stderr line, "error: ..." (after the
    download progress bar's lines where `progress`); returns that line."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.replace("\r", "\n").split("\n") if line.strip()] if progress else err.splitlines()
    assert err.endswith("\n") and lines[-1].startswith("error: ") and err.count("error:") == 1, err
    assert progress or len(lines) == 1, err
    assert "Traceback" not in err
    return lines[-1]


def test_bad_params_name_the_key(empty_project, params, capsys):
    params["evaluation"]["selection_metric"] = "best_of_three"
    (empty_project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    line = one_error_line(["validate"], capsys)
    assert "selection_metric" in line and "best_of_three" in line


def test_unknown_table_names_the_known_ones(empty_project, capsys):
    line = one_error_line(["table", "table99"], capsys)
    assert "unknown table 'table99'" in line and "table3a" in line


@pytest.mark.parametrize("setting, cause", [("gamma", "expected KEY=VALUE"), ("temperature=2", "unknown setting"),
                                            ("gamma=0.33", "no cell of table3a matches")])
def test_cell_with_a_bad_set(empty_project, capsys, setting, cause):
    assert cause in one_error_line(["cell", "table3a", "--set", setting, "--dry-run"], capsys)


@pytest.mark.parametrize("option", ["--benchmark", "--dataset"])
def test_cell_takes_a_benchmark_also_under_its_old_name(empty_project, capsys, option):
    """`--dataset` was the option's first name (it always took a benchmark): hidden, it still works."""
    assert build_parser().parse_args(["cell", "table3a", option, "long_dci"]).benchmark == "long_dci"
    line = one_error_line(["cell", "table3a", option, "vg", "--dry-run"], capsys)  # vg trains, it is no benchmark
    assert "table3a has no benchmark 'vg'" in line and "long_dci" in line


def test_lineage_of_a_table_not_built(empty_project, capsys):
    line = one_error_line(["lineage", "results/tables/table3a.csv", "--cell", "gamma=0.5/docci/t2i/R@1"], capsys)
    assert "table3a.provenance.json not found" in line and "hnclip table table3a" in line


def test_failed_download(empty_project, server, capsys):
    server.add("/longclip_l/longclip-L.pt", b"not the Long-CLIP weights")
    line = one_error_line(["download", "longclip_l", "--mirror", server.url], capsys, progress=True)
    assert "longclip-L.pt: size is 25 bytes, expected 1711923133" in line  # the pinned release's size
    assert not list(empty_project.glob("data/*/longclip_l/raw/longclip-L.pt*"))  # nothing kept, nothing marked


def test_replaced_checkpoint_is_a_stale_artifact(empty_project, capsys):
    reg = Registry(load_params("params.yaml"), validate=False)
    run_id = next(c.run_id for c in reg.cells("table3a") if c.benchmark == "docci")
    run_dir = empty_project / "results" / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "model.pt").write_bytes(b"other weights")
    (run_dir / "train.json").write_text(json.dumps({"outputs": {"model": {"sha256": "0" * 64}}}))
    line = one_error_line(["evaluate", "--run", run_id, "--benchmark", "docci"], capsys)
    assert f"checkpoint was replaced; retrain {run_id}" in line


def test_an_unexpected_exception_keeps_its_traceback(empty_project, monkeypatch):
    import hnclip.commands.report as report

    def broken(*args, **kwargs):
        return 1 / 0
    monkeypatch.setattr(report, "build_table", broken)
    with pytest.raises(ZeroDivisionError):
        main(["table", "table3a"])


# The same through the interpreter, as a shell and Snakemake see it: exit status and stderr.
BROKEN_TABLE = """
import sys
import hnclip.commands.report as report
report.build_table = lambda *args: 1 / 0
from hnclip.cli import main
sys.exit(main(["table", "table3a"]))
"""


def test_exit_status_and_stderr_of_the_process(empty_project):
    user_error = subprocess.run([sys.executable, "-m", "hnclip", "table", "table99"], capture_output=True, text=True)
    assert user_error.returncode == 2 and user_error.stdout == ""
    assert user_error.stderr.startswith("error: unknown table 'table99'") and user_error.stderr.count("\n") == 1
    bug = subprocess.run([sys.executable, "-c", BROKEN_TABLE], capture_output=True, text=True)
    assert bug.returncode == 1
    assert "Traceback (most recent call last)" in bug.stderr and "ZeroDivisionError" in bug.stderr
