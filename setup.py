"""The optional C extension; everything else is in pyproject.toml.

``otelprof.integrations._torch_native`` is the PyTorch integration's hot path in C. It is optional: where it
cannot be compiled (no compiler or Python headers) the install goes on and the same hooks run in Python.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "otelprof.integrations._torch_native",
            sources=["otelprof/integrations/_torch_native.c"],
            optional=True,
        )
    ]
)
