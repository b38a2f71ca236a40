"""rlfarm.nn.adam.Adam is torch.optim.Adam(fused=True) without torch.optim's import of torch._dynamo:
the same parameters bit for bit, the same state_dict both ways, and a learner that never imports it."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlfarm.nn.adam import Adam

ROOT = Path(__file__).resolve().parents[1]


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))


def _train(net, opt, steps: int, lrs=None) -> None:
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    for i in range(steps):
        if lrs is not None:
            opt.param_groups[0]["lr"] = lrs[i]
        opt.zero_grad()
        (net(x).pow(2).mean() + net(x).sin().sum() * 1e-3).backward()
        opt.step()


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize("eps", [1e-8, 1e-5])
def test_the_updates_are_torchs_fused_adam_bit_for_bit_with_an_annealed_lr(eps):
    ours, theirs = _net(), _net()
    lrs = [1e-3 * (1 - i / 40) for i in range(30)]
    _train(ours, Adam(ours.parameters(), lr=1e-3, eps=eps), 30, lrs)
    _train(theirs, torch.optim.Adam(theirs.parameters(), lr=1e-3, eps=eps, fused=True), 30, lrs)
    assert _same(ours, theirs)
    assert not _same(ours, _net())  # it did learn something


def test_state_dicts_are_torchs_and_load_both_ways():
    ours, theirs = _net(), _net()
    o = Adam(ours.parameters(), lr=3e-4, eps=1e-5)
    t = torch.optim.Adam(theirs.parameters(), lr=3e-4, eps=1e-5, fused=True)
    _train(ours, o, 5)
    _train(theirs, t, 5)
    so, st = o.state_dict(), t.state_dict()
    assert so["param_groups"] == st["param_groups"]
    assert so["state"].keys() == st["state"].keys()
    for i, entries in st["state"].items():
        assert so["state"][i].keys() == entries.keys()
        for k, v in entries.items():
            assert torch.equal(so["state"][i][k], v) and so["state"][i][k].dtype == v.dtype
    # A checkpoint of one continues in the other exactly as in itself (copied, as read from a file:
    # loading keeps the tensors it is given, as torch.optim does).
    so, st = copy.deepcopy(so), copy.deepcopy(st)
    a, b = _net(5), _net(5)
    a.load_state_dict(theirs.state_dict())
    b.load_state_dict(ours.state_dict())
    oa = Adam(a.parameters(), lr=1.0)
    oa.load_state_dict(st)
    tb = torch.optim.Adam(b.parameters(), lr=1.0, fused=True)
    tb.load_state_dict(so)
    assert oa.param_groups[0]["lr"] == 3e-4 and oa.param_groups[0]["betas"] == (0.9, 0.999)
    _train(a, oa, 5)
    _train(b, tb, 5)
    _train(ours, o, 5)
    assert _same(a, b) and _same(a, ours)


def test_parameters_without_a_gradient_are_left_alone():
    net = _net()
    frozen = net[0].weight.detach().clone()
    net[0].weight.requires_grad_(False)
    opt = Adam([p for p in net.parameters()], lr=1e-2)
    _train(net, opt, 3)
    assert torch.equal(net[0].weight, frozen)
    assert net[0].weight not in opt.state and len(opt.state) == 3


def test_a_state_dict_of_other_parameters_is_refused():
    opt = Adam(_net().parameters(), lr=1e-3)
    other = torch.optim.Adam(torch.nn.Linear(2, 2).parameters(), lr=1e-3, fused=True)
    with pytest.raises(ValueError, match="different number of parameters"):
        opt.load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match="empty parameter list"):
        Adam([], lr=1e-3)


LEARN_EVERY_ALGORITHM = """
import sys
from tests.test_algos import LEARNERS, env_for, make, rollout_for, train_once

for algo, mode in LEARNERS:
    env = env_for(algo, "vector")
    algorithm, _ = make(algo, env, mode=mode)
    train_once(algorithm, rollout_for(algorithm, env, seed=3))
    algorithm.restore(*algorithm.checkpoint())
print(sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules))
"""


@pytest.mark.process
def test_no_learner_imports_torch_dynamo():
    """The second or so of CPU this saves in every trainer start (benchmarks/startup.py) is lost the
    moment anything imports torch.optim's optimizers again."""
    out = subprocess.run(
        [sys.executable, "-c", LEARN_EVERY_ALGORITHM], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
