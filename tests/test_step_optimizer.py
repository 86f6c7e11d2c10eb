"""The optimizer `build_optimizer` makes: fused AdamW only where every parameter is on CUDA; on the CPU
the same updates as torch's default AdamW over the same groups, bit for bit."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from hnclip.training.schedule import adamw_implementation, build_optimizer

RECIPE = {"lr": 1e-3, "weight_decay": 0.05}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    for _ in range(4):
        optimizer.zero_grad()
        model(torch.randn(8, 6, generator=generator)).pow(2).mean().backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def test_cpu_updates_equal_todays_default_adamw_bitwise():
    model, reference_model = _model(), _model()
    optimizer = build_optimizer(model, RECIPE)
    assert not optimizer.defaults["fused"]
    assert [len(g["params"]) for g in optimizer.param_groups] == [4, 2]  # no decay: biases and the norm
    groups = [{"params": [p for p in reference_model.parameters() if (p.ndim < 2) == no_decay],
               "weight_decay": 0.0 if no_decay else 0.05} for no_decay in (True, False)]
    reference = torch.optim.AdamW(groups, lr=RECIPE["lr"])
    trained, expected = _train(model, optimizer), _train(reference_model, reference)
    assert all(torch.equal(a, b) for a, b in zip(trained, expected, strict=True))
    assert not torch.equal(trained[0], list(_model().parameters())[0])  # the steps did update


def test_fused_only_when_every_parameter_is_on_cuda():
    on = {kind: SimpleNamespace(device=torch.device(kind)) for kind in ("cuda", "cpu")}
    assert adamw_implementation([{"params": [on["cuda"], on["cuda"]]}]) == {"fused": True}
    assert adamw_implementation([{"params": [on["cuda"]]}, {"params": [on["cpu"]]}]) == {}
    assert adamw_implementation([{"params": [on["cpu"]]}]) == {}
