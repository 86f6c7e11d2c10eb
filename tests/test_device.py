"""Device selection with simulated availability (no accelerator on the test machine)."""
from __future__ import annotations

import contextlib
import importlib
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from hnclip.runtime import device as dev
from hnclip.runtime.device import (
    DeviceUnavailableError,
    autocast_context,
    describe_device,
    resolve_device,
)


class CannNotFound(Exception):
    """Stands for whatever torch_npu raises on a machine without a working CANN."""


@pytest.fixture
def npu_import_fails(monkeypatch):
    """`import torch_npu` raises something that is not an ImportError (as a broken CANN does)."""
    real_import_module = importlib.import_module

    def import_module(name, *args, **kwargs):
        if name == "torch_npu":
            raise CannNotFound("libascendcl.so: cannot open shared object file")
        return real_import_module(name, *args, **kwargs)

    monkeypatch.setattr(dev.importlib, "import_module", import_module)


@pytest.fixture
def no_accelerators(monkeypatch, npu_import_fails):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.fixture
def two_cuda_devices(monkeypatch, no_accelerators):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: f"Fake GPU {index}")


@pytest.fixture
def mps_only(monkeypatch, no_accelerators):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)


# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("error", [RuntimeError("CANN"), OSError("libhccl.so"), AttributeError("x"),
                                   CannNotFound("boom"), ImportError("no torch_npu")])
def test_any_torch_npu_import_error_means_no_npu(monkeypatch, error):
    def import_module(name, *args, **kwargs):
        raise error

    monkeypatch.setattr(dev.importlib, "import_module", import_module)
    assert dev.import_torch_npu() is None
    assert dev.npu_count() == 0
    assert "npu" not in dev.available_devices()


def test_cpu_only(no_accelerators):
    assert dev.available_devices() == {"cpu": 1}
    assert resolve_device() == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("requested", ["cuda", "cuda:0", "npu", "mps", "cpu:1"])
def test_absent_device_raises_naming_what_is_available(no_accelerators, requested):
    with pytest.raises(DeviceUnavailableError, match=rf"'{requested}' is not available; available: cpu"):
        resolve_device(requested)


def test_cuda_preferred_over_mps_and_cpu(two_cuda_devices, monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("mps") == torch.device("mps")
    assert resolve_device("cpu") == torch.device("cpu")


def test_missing_cuda_index_names_the_count(two_cuda_devices):
    with pytest.raises(DeviceUnavailableError, match=r"available: cuda \(x2\), cpu"):
        resolve_device("cuda:2")
    with pytest.raises(DeviceUnavailableError, match="'npu'"):
        resolve_device("npu")


def test_mps_preferred_over_cpu(mps_only):
    assert resolve_device() == torch.device("mps")


@pytest.mark.parametrize("requested", ["gpu", "cuda:x", "tpu", ""])
def test_malformed_request_is_a_value_error(no_accelerators, requested):
    with pytest.raises(ValueError, match="not a device"):
        resolve_device(requested)


def test_autocast_bf16_on_cuda_only_when_asked():
    with pytest.warns(UserWarning):  # no GPU here: torch warns that it disables the context
        context = autocast_context(torch.device("cuda", 0), "bf16")
    assert isinstance(context, torch.autocast)
    assert context.device == "cuda" and context.fast_dtype == torch.bfloat16
    assert isinstance(autocast_context("cuda", "fp32"), contextlib.nullcontext)


def test_autocast_bf16_on_npu(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "autocast", lambda **kwargs: calls.append(kwargs) or "autocast")
    assert autocast_context("npu:0", "bf16") == "autocast"
    assert calls == [{"device_type": "npu", "dtype": torch.bfloat16}]


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "mps"])
def test_cpu_and_mps_stay_fp32(device):
    context = autocast_context(device, "bf16")
    assert isinstance(context, contextlib.nullcontext)
    with context:
        x = torch.ones(2, 2) @ torch.ones(2, 2)
    assert x.dtype == torch.float32


def test_unknown_precision_is_rejected():
    with pytest.raises(ValueError, match="fp16"):
        autocast_context("cuda", "fp16")


def test_describe_cpu(no_accelerators):
    info = describe_device(resolve_device())
    assert info["type"] == "cpu" and info["count"] == 1 and info["torch"] == torch.__version__
    assert isinstance(info["name"], str) and info["name"]
    json.dumps(info)  # provenance records are JSON


def test_describe_cuda(two_cuda_devices):
    info = describe_device("cuda:1")
    assert info == {**info, "type": "cuda", "index": 1, "name": "Fake GPU 1", "count": 2, "cuda": torch.version.cuda}


FAKE_TORCH_NPU = '''
"""Stand-in for torch_npu: registers the privateuse1 backend as "npu", like the real one."""
import types
import torch

torch.utils.rename_privateuse1_backend("npu")
npu = types.ModuleType("torch_npu.npu")
npu.is_available = lambda: True
npu.device_count = lambda: 8
npu.get_device_name = lambda index=0: "Ascend 910B"
torch._register_device_module("npu", npu)
__version__ = "2.14.0"
'''

NPU_PROBE = '''
import json, torch
from hnclip.runtime.device import DeviceUnavailableError, describe_device, resolve_device
torch.cuda.is_available = lambda: True      # NPU must still win
torch.cuda.device_count = lambda: 1
result = {"auto": str(resolve_device()), "npu7": str(resolve_device("npu:7")), "info": describe_device("npu:0")}
try:
    resolve_device("npu:8")
except DeviceUnavailableError as error:
    result["error"] = str(error)
print(json.dumps(result))
'''


def test_npu_preferred_when_torch_npu_works(tmp_path):
    # A subprocess: renaming the privateuse1 backend cannot be undone inside this test process.
    (tmp_path / "torch_npu.py").write_text(FAKE_TORCH_NPU)
    src = str(Path(dev.__file__).parents[1])
    env = {"PYTHONPATH": f"{tmp_path}:{src}", "PATH": "/usr/bin:/bin"}
    completed = subprocess.run([sys.executable, "-c", textwrap.dedent(NPU_PROBE)], env=env,
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["auto"] == "npu:0" and result["npu7"] == "npu:7"
    assert result["info"]["name"] == "Ascend 910B" and result["info"]["count"] == 8
    assert result["info"]["torch_npu"] == "2.14.0"
    assert "available: npu (x8), cuda (x1), cpu" in result["error"]


# ---- a profile that needs an accelerator refuses the CPU ------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
OLD_DRIVER = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"


@pytest.fixture
def old_driver(no_accelerators, monkeypatch, tmp_path):
    """A CUDA 13.0 torch build on a machine whose NVIDIA driver (535) is too old for it: torch sees no GPU."""
    from hnclip.runtime import accelerator_needs
    proc = tmp_path / "nvidia-version"
    proc.write_text(OLD_DRIVER)
    monkeypatch.setattr(accelerator_needs, "NVIDIA_PROC_VERSION", proc)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(accelerator_needs, "torch_npu_version", lambda: None)
    return proc


def test_the_lock_names_its_torch_build_and_the_driver_it_needs(tmp_path):
    from hnclip.runtime.accelerator_needs import MIN_DRIVER, driver_supports, lock_torch_build
    assert lock_torch_build(ROOT / "requirements.lock") == {"torch": "2.14.1", "build": "cu130", "cuda": "13.0"}
    (tmp_path / "cu128.lock").write_text("# pins\ntorch==2.14.1+cu128\nsix==1.17.0\n")
    assert lock_torch_build(tmp_path / "cu128.lock") == {"torch": "2.14.1", "build": "cu128", "cuda": "12.8"}
    assert lock_torch_build(tmp_path / "absent.lock") is None
    assert MIN_DRIVER == {"13.0": "580.65.06", "12.8": "570.26"}
    assert driver_supports("580.65.06", "13.0") and driver_supports("590.1", "13.0")
    assert driver_supports("575.57.08", "13.0") is False and driver_supports("575.57.08", "12.8") is True
    assert driver_supports(None, "13.0") is None and driver_supports("580.65.06", None) is None


def test_the_paper_profile_refuses_the_cpu_naming_driver_and_torch_builds(old_driver, empty_project, params, capsys,
                                                                          monkeypatch):
    from hnclip.cli import main
    from hnclip.config.registry import Registry
    shutil.copy(ROOT / "requirements.lock", empty_project / "requirements.lock")
    assert main(["--profile", "paper", "train", "--run", "docci-hn_clip-anything"]) == 2
    message = " ".join(capsys.readouterr().err.split())
    assert "this profile needs an accelerator (execution.require_accelerator: true), but device 'auto' finds none" \
        in message
    assert "torch: " + torch.__version__ + " (CUDA build: 13.0; torch.cuda.is_available(): False)" in message
    assert f"NVIDIA driver: 535.104.05 (from {old_driver}): too old for CUDA 13.0 (needs >= 580.65.06)" in message
    assert "torch_npu: not installed; accelerators: none" in message
    assert "requirements.lock installs torch 2.14.1 (cu130, CUDA 13.0: needs NVIDIA driver >= 580.65.06)" in message
    assert "HNCLIP_TORCH_BUILD=cu130|cu128|cpu" in message and "execution.device: cpu" in message
    # every GPU job refuses: an evaluation that encodes (the released backbone's); a gather of shards does not
    zeroshot = Registry(params, profile="paper").zeroshot_id()
    assert main(["--profile", "paper", "evaluate", "--run", zeroshot, "--benchmark", "docci"]) == 2
    assert "needs an accelerator" in capsys.readouterr().err
    from hnclip.commands import auxiliary
    monkeypatch.setattr(auxiliary, "build_auxiliary", lambda *args: "built")  # the guard only, not the build
    assert main(["--profile", "paper", "auxiliary", "segments", "--dataset", "docci", "--shard", "0"]) == 2
    assert main(["--profile", "paper", "auxiliary", "segments", "--dataset", "docci", "--gather"]) == 0
    assert main(["--profile", "paper", "auxiliary", "edges", "--dataset", "docci"]) == 0  # a CPU job
    assert capsys.readouterr().err.count("needs an accelerator") == 1


def test_only_an_accelerator_or_an_explicit_cpu_meets_the_need(old_driver, monkeypatch):
    from hnclip.runtime.device import AcceleratorRequiredError, device_needs_problem
    paper = {"device": "auto", "require_accelerator": True, "tf32": True}
    with pytest.raises(AcceleratorRequiredError, match="finds none here"):
        dev.require_device_needs(paper)
    assert "'cuda:1' finds none" in device_needs_problem({**paper, "device": "cuda:1"})
    assert device_needs_problem({**paper, "device": "cpu"}) is None  # asked for on purpose
    assert dev.compute_device(paper, requested="cpu") == torch.device("cpu")
    assert device_needs_problem({"device": "auto"}) is None  # the embedded profiles: the CPU is fine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert device_needs_problem(paper) is None and device_needs_problem({**paper, "device": "cuda:0"}) is None
