"""`hnclip evaluate` on a real micro project: in-domain records come from the training record
(no model is loaded), a replaced checkpoint or changed evaluation settings are refused with an
actionable message, and a transfer benchmark is encoded from the checkpoint selected on the run's
own benchmark."""
import copy
import shutil

import pytest
from helpers.micro_project import copy_project

from hnclip.commands.evaluate import evaluate_run, select_epochs
from hnclip.config.params import load_params
from hnclip.config.registry import Registry
from hnclip.io import read_json
from hnclip.models import factory

pytestmark = pytest.mark.slow


@pytest.fixture
def project(micro_project, tmp_path, monkeypatch):
    """A copy whose weights are the micro project's (read, never written: evaluations are written atomically)."""
    proj = copy_project(micro_project, tmp_path / "proj", share_weights=True)
    monkeypatch.chdir(proj)
    return proj


@pytest.fixture
def project_with_own_weights(micro_project, tmp_path, monkeypatch):
    """A copy whose weights a test may overwrite."""
    proj = copy_project(micro_project, tmp_path / "proj")
    monkeypatch.chdir(proj)
    return proj


def _registry(proj, **evaluation) -> Registry:
    params = load_params(proj / "params.yaml")
    params["evaluation"] = {**params["evaluation"], **evaluation}
    return Registry(copy.deepcopy(params), validate=False)


def _docci_run(reg) -> str:
    return next(c.run_id for c in reg.cells("table3a") if c.benchmark == "docci")


def test_in_domain_evaluation_is_selected_from_the_training_record(project, monkeypatch):
    reg = _registry(project)
    run_id = _docci_run(reg)

    def no_model(*args, **kwargs):
        raise AssertionError("an in-domain evaluation must not load a model")
    monkeypatch.setattr(factory, "load_weights", no_model)
    monkeypatch.setattr(factory, "load_backbone", no_model)
    out = read_json(evaluate_run(reg, run_id, "docci"))
    train = read_json(project / "results/runs" / run_id / "train.json")
    chosen = select_epochs(train["history"], "docci")
    assert out["best"]["metrics"] == chosen["best"]["metrics"] and out["best"]["epoch"] == chosen["best"]["epoch"]
    assert out["last"]["weights_sha256"] == train["history"][-1]["weights_sha256"]
    assert out["consistent_with_training"] is True and train["saved_weights_match_last_epoch"] is True


def test_replaced_checkpoint_is_refused(project_with_own_weights):
    project = project_with_own_weights
    reg = _registry(project)
    run_id = _docci_run(reg)
    other = next(r for r in reg.runs() if r != run_id)
    shutil.copy(project / "results/runs" / other / "model.pt", project / "results/runs" / run_id / "model.pt")
    with pytest.raises(RuntimeError, match=f"checkpoint was replaced; retrain {run_id}"):
        evaluate_run(reg, run_id, "docci")


def test_changed_evaluation_settings_require_retraining(project):
    reg = _registry(project, tie_rule="optimistic")
    with pytest.raises(RuntimeError, match="evaluation settings .* retrain it"):
        evaluate_run(reg, _docci_run(reg), "docci")


def test_transfer_benchmark_is_encoded_from_the_selected_checkpoint(project):
    reg = _registry(project)
    run_id = _docci_run(reg)  # trained on DOCCI, never evaluated on DCI while training
    out = read_json(evaluate_run(reg, run_id, "dci"))
    train = read_json(project / "results/runs" / run_id / "train.json")
    selected = train["selected_checkpoint"]  # chosen on DOCCI, the run's own benchmark
    assert selected["epoch"] == select_epochs(train["history"], "docci")["best"]["epoch"]
    assert out["best"]["epoch"] == selected["epoch"] and out["best"]["checkpoint"] == "model_selected"
    assert out["best"]["weights_sha256"] == selected["weights_sha256"]
    assert out["last"]["epoch"] == train["history"][-1]["epoch"] and out["last"]["checkpoint"] == "model"
    assert out["last"]["metrics"]["n"] == 32 and 0 <= out["best"]["metrics"]["t2i"]["R@1"] <= 100
    assert out["consistent_with_training"] is None
