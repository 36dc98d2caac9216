"""``otelprof.torch``: the PyTorch integration (see :mod:`otelprof.integrations.torch`)."""

from otelprof.integrations.tensors import record_labels
from otelprof.integrations.torch import (
    TorchInstrumentation,
    auto_instrument,
    instrument,
    profile_window,
    uninstrument,
)

__all__ = ["TorchInstrumentation", "auto_instrument", "instrument", "profile_window", "record_labels", "uninstrument"]
