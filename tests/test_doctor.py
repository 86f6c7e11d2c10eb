"""`hnclip doctor`: the device a profile's jobs would compute on and why, the free disk against the plan's
peak, and an exit status that says whether the profile's GPU jobs would refuse to start here."""
from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from hnclip.cli import main
from hnclip.commands import doctor
from hnclip.config.registry import Registry
from hnclip.plan.cost_plan import build_plan
from hnclip.runtime import accelerator_needs

ROOT = Path(__file__).resolve().parents[1]
Usage = namedtuple("Usage", "total used free")
FREE_GB = 120.0


@pytest.fixture
def machine(empty_project, monkeypatch, tmp_path_factory):
    """No accelerator, a 535 driver (too old for the lock's CUDA 13.0 torch), 120 GB free, the project's lock."""
    proc = tmp_path_factory.mktemp("proc") / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n")
    monkeypatch.setattr(accelerator_needs, "NVIDIA_PROC_VERSION", proc)
    monkeypatch.setattr(accelerator_needs, "torch_npu_version", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda path: Usage(500e9, 380e9, FREE_GB * 1e9))
    shutil.copy(ROOT / "requirements.lock", empty_project / "requirements.lock")
    return empty_project


def test_the_paper_profile_on_a_machine_without_a_gpu(machine, params, capsys):
    reg = Registry(params, profile="paper")
    peak = sum(build_plan(reg).disk.values())
    found = doctor.checkup(reg)
    assert not found.device_needs_met and found.disk_short_gb == pytest.approx(peak - FREE_GB)
    assert found.lines[:7] == [
        "profile: paper",
        "device: execution.device auto -> cpu (require_accelerator: true)",
        f"torch: {torch.__version__} (CUDA build: 13.0; torch.cuda.is_available(): False)",
        f"NVIDIA driver: 535.104.05 (from {accelerator_needs.NVIDIA_PROC_VERSION}): too old for CUDA 13.0 "
        "(needs >= 580.65.06)",
        "torch_npu: not installed",
        "accelerators: none",
        "lock: requirements.lock installs torch 2.14.1 (cu130, CUDA 13.0: needs NVIDIA driver >= 580.65.06)"]
    assert found.lines[7] == (f"disk: {FREE_GB:,.1f} GB free at {machine.resolve()}; the plan's peak: {peak:,.1f} GB "
                              f"(short by {peak - FREE_GB:,.1f} GB)")
    assert found.lines[8].startswith("device needs: NOT MET: this profile needs an accelerator")
    assert main(["doctor", "--profile", "paper"]) == 1
    assert capsys.readouterr().out.splitlines() == found.lines


def test_the_embedded_profile_and_an_explicit_cpu_are_met(machine, params, capsys):
    assert main(["doctor"]) == 0  # tiny: device cpu, no accelerator required
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "device: execution.device cpu -> cpu (require_accelerator: false)"
    assert out[-1] == "device needs: met" and out[-2].endswith("(enough)")
    params["profiles"]["paper"]["execution"]["device"] = "cpu"  # the CPU on purpose
    assert doctor.checkup(Registry(params, profile="paper")).device_needs_met


def test_a_new_enough_driver_and_a_visible_gpu_meet_the_paper_profiles_need(machine, params, monkeypatch):
    accelerator_needs.NVIDIA_PROC_VERSION.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05\n")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    found = doctor.checkup(Registry(params, profile="paper"))
    assert found.device_needs_met and found.lines[-1] == "device needs: met"
    assert found.lines[1] == "device: execution.device auto -> cuda:0 (require_accelerator: true)"
    assert found.lines[3].endswith("580.95.05 (from " + str(accelerator_needs.NVIDIA_PROC_VERSION)
                                   + "): supports CUDA 13.0")
    assert found.lines[5] == "accelerators: cuda x4"
