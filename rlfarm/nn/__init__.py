"""Networks and what acts with them, PURE (torch, numpy, ONNX Runtime): layers every algorithm builds
from, observation normalisation, and the actors workers act with. See docs/architecture.md."""
