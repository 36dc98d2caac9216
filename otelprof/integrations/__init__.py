"""Framework integrations: PyTorch (``otelprof.integrations.torch``) and the trainer callbacks for Lightning
(``otelprof.integrations.lightning``) and the Hugging Face ``Trainer`` (``otelprof.integrations.transformers``),
each imported only when used.

May import: the runtime core (:mod:`otelprof.runtime`, :mod:`otelprof.shared`, :mod:`otelprof.recording`) and
the catalog and configuration modules; never the command line, the analysis, the report or the mixin. What must
live as long as a session registers with :mod:`otelprof.runtime.extensions`.
"""
