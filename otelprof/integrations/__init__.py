"""Framework integrations: PyTorch (``otelprof.integrations.torch``) and the trainer callbacks for Lightning
(``otelprof.integrations.lightning``) and the Hugging Face ``Trainer`` (``otelprof.integrations.transformers``),
each imported only when used."""
