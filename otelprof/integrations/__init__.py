"""Framework integrations: PyTorch (``otelprof.integrations.torch``)."""
