"""The torch side of acting (PURE: torch, numpy, ONNX Runtime): numpy steps of a torch MLP module, and
ONNX Runtime for CNNs. The `Actor` interface and everything a worker acting an MLP needs are in
rlfarm.nn.acting, which imports no torch. Each algorithm's actors are in its package
(`rlfarm/algos/<name>/acting.py`, torch-free, and `policies.py`).
"""

from __future__ import annotations

import copy
import io
import os
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn

from rlfarm.envs import SpaceSpec


def numpy_state(network: nn.Module) -> dict[str, np.ndarray]:
    """A network's saved tensors as numpy arrays on the CPU: what rlfarm.nn.acting's actors are built
    from, as a worker builds them from a version's tensors."""
    return {name: value.detach().cpu().numpy() for name, value in network.state_dict().items()}


# ---- ONNX Runtime for acting with CNNs -------------------------------------------------------------

# "auto": ONNX Runtime for CNN actors where onnx and onnxruntime import, else torch; "torch": always
# torch (the benchmarks compare the two). Read by each worker process from its environment.
ACTOR_RUNTIME_VARIABLE = "RLFARM_ACTOR_RUNTIME"


class OnnxGraph:
    """A network's acting function exported to ONNX once per network (on the worker, from rlfarm's
    own classes: no graph is ever read from Redis), then run by ONNX Runtime with each version's
    weights written into a fresh copy of the graph's initializers. Never into one kept copy: protobuf
    keeps what a message replaced until the message is freed, so writing each version into the same
    model grew a worker by the model's size per version (4 GB after 600 Pong versions;
    tests/test_policy.py checks it does not grow).

    The function takes `obs` and returns (`out`, `value`); a recurrent one (`state_size` > 0) takes
    (`obs`, `state`) and returns (`out`, `value`, `next_state`), the state (batch, state_size) float32."""

    def __init__(self, module: nn.Module, prefix: str, example: torch.Tensor, state_size: int = 0):
        import onnx

        exported = copy.deepcopy(module).cpu().eval()
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():  # distinct values: the exporter merges initializers that are equal (zero biases)
            for parameter in exported.parameters():
                parameter.normal_(generator=generator)
        buffer = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notices
            # No constant folding: it would bake the first layer's 1/255 into a new, unnamed weight.
            inputs, outputs = ["obs"], ["out", "value"]
            examples: tuple[torch.Tensor, ...] = (example,)
            if state_size:
                inputs, outputs = [*inputs, "state"], [*outputs, "next_state"]
                examples = (example, torch.zeros((len(example), state_size), dtype=torch.float32))
            torch.onnx.export(
                exported,
                examples,
                buffer,
                input_names=inputs,
                output_names=outputs,
                dynamic_axes={name: {0: "batch"} for name in inputs},
                dynamo=False,
                do_constant_folding=False,
            )
        self.model_bytes = buffer.getvalue()
        self.keys = {}
        for init in onnx.load_from_string(self.model_bytes).graph.initializer:
            if not init.name.startswith(prefix):
                raise ValueError(f"ONNX initializer {init.name!r} is not a weight of the network")
            self.keys[init.name] = init.name[len(prefix) :]
        # Every weight the function uses must be an initializer of its own, to be replaced per version.
        used = {name for name, _ in exported.named_parameters() if name.startswith(prefix)}
        if used - set(self.keys):
            raise ValueError(f"weights folded into the ONNX graph: {sorted(used - set(self.keys))}")

    def session(self, state: dict[str, torch.Tensor]) -> Any:
        import onnx
        import onnxruntime
        from onnx import numpy_helper

        # A fresh copy of the exported model per version, dropped once serialised (see the class).
        model = onnx.load_from_string(self.model_bytes)
        for init in model.graph.initializer:
            array = state[self.keys[init.name]].detach().cpu().contiguous().numpy()
            init.CopyFrom(numpy_helper.from_array(array, init.name))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # one core per worker process, as torch there
        options.inter_op_num_threads = 1
        return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def onnx_graph(network: nn.Module, module: nn.Module, spec: SpaceSpec, state_size: int = 0) -> OnnxGraph | None:
    """The network's OnnxGraph, exported on first use and kept on the network (a worker loads every
    version into one network per run), or None where ONNX Runtime is not to be used: not installed,
    RLFARM_ACTOR_RUNTIME=torch, or a network the exporter cannot take. `state_size`: a recurrent
    network's (its function takes and returns the state, OnnxGraph)."""
    cached = network.__dict__.get("_onnx_graph", False)
    if cached is not False:
        return cached
    graph = None
    if os.environ.get(ACTOR_RUNTIME_VARIABLE, "auto") != "torch" and onnx_installed():
        example = torch.zeros((1, *spec.obs_shape), dtype=torch.uint8)
        try:
            graph = OnnxGraph(module, "policy.", example, state_size)
        except Exception:  # an exporter gap must not stop acting: torch acts instead
            graph = None
    network.__dict__["_onnx_graph"] = graph
    return graph


def onnx_installed() -> bool:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True
