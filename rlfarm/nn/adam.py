"""Adam as torch.optim.Adam(fused=True) computes it, without importing torch.optim.

Every torch.optim optimizer imports torch._dynamo at its first call (its methods are wrapped to keep
torch.compile out), and that import costs more than a second of CPU in every trainer process
(benchmarks/startup.py). This class keeps the optimizer's whole maths in torch's own fused kernel
(torch._fused_adam_, the one torch.optim.Adam(fused=True) calls) and only does the bookkeeping
around it: the same updates bit for bit, and the same state_dict, so checkpoints written with
torch.optim.Adam load here and the other way round (tests/test_adam.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

# The hyper-parameters torch.optim.Adam writes into each param group of its state_dict.
_FIXED = {
    "weight_decay": 0,
    "amsgrad": False,
    "maximize": False,
    "foreach": None,
    "capturable": False,
    "differentiable": False,
    "fused": True,
    "decoupled_weight_decay": False,
}


class Adam:
    """Adam (Kingma and Ba 2015) on one group of parameters: `lr`, `betas`, `eps` as torch.optim.Adam;
    no weight decay, no AMSGrad. `param_groups[0]["lr"]` may be set between steps (annealing)."""

    def __init__(
        self, params: Iterable[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
    ) -> None:
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        self.param_groups: list[dict[str, Any]] = [
            {"params": params, "lr": lr, "betas": tuple(betas), "eps": eps, **_FIXED}
        ]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state.get(p)
                if state is None:
                    state = self.state[p] = _fresh_state(p)
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                steps.append(state["step"])
            if not params:
                continue
            beta1, beta2 = group["betas"]
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                [],
                steps,
                amsgrad=False,
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                weight_decay=0.0,
                eps=group["eps"],
                maximize=False,
                grad_scale=None,
                found_inf=None,
            )

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's layout: parameters by index across groups, the state of those stepped."""
        index: dict[torch.Tensor, int] = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                ids.append(index.setdefault(p, len(index)))
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        state = {index[p]: dict(s) for p, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups) or any(
            len(g["params"]) != len(s["params"]) for g, s in zip(self.param_groups, saved, strict=True)
        ):
            raise ValueError("loaded state dict has a different number of parameters or groups")
        by_index = {}
        for group, s in zip(self.param_groups, saved, strict=True):
            by_index.update(zip(s["params"], group["params"], strict=True))
        self.state = {}
        for i, entries in state_dict["state"].items():
            p = by_index[int(i)]
            self.state[p] = {
                "step": torch.as_tensor(entries["step"], dtype=torch.float32).to(p.device).reshape(()),
                "exp_avg": entries["exp_avg"].to(dtype=p.dtype, device=p.device),
                "exp_avg_sq": entries["exp_avg_sq"].to(dtype=p.dtype, device=p.device),
            }
        for group, s in zip(self.param_groups, saved, strict=True):
            group.update({k: v for k, v in s.items() if k != "params"})
            group["betas"] = tuple(group["betas"])


def _fresh_state(p: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "step": torch.zeros((), dtype=torch.float32, device=p.device),
        "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
        "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
    }
