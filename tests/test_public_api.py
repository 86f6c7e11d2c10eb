"""Public entry points are exported from their package (as open_clip does), and importing a
package does not pull in torch (the Snakefile imports the registry on every `snakemake` call)."""
import importlib
import subprocess
import sys

import pytest

PACKAGES = ["hnclip.config", "hnclip.data", "hnclip.evaluation", "hnclip.losses", "hnclip.models",
            "hnclip.provenance", "hnclip.runtime", "hnclip.training"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_resolves(package):
    module = importlib.import_module(package)
    assert module.__all__
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"


def test_named_entry_points():
    from hnclip.losses import hn_loss
    from hnclip.models import load_longclip
    from hnclip.training import TrainJob, train
    assert hn_loss.__module__ == "hnclip.losses.objective"  # beside the objective that uses it
    assert load_longclip.__module__ == "hnclip.models.longclip"
    assert train.__module__ == TrainJob.__module__ == "hnclip.training.loop"


def test_light_packages_do_not_import_torch():
    code = ("import sys, hnclip.config, hnclip.models, hnclip.training, hnclip.evaluation, hnclip.data, "
            "hnclip.runtime, hnclip.provenance, hnclip.commands.data, hnclip.training.jobs; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
