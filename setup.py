"""The optional C extension; everything else is in pyproject.toml.

``otelprof.integrations._torch_native`` is the PyTorch integration's hot path in C. It is optional: where it
cannot be compiled (no compiler or Python headers) the install goes on and the same hooks run in Python;
``otelprof doctor`` says which hooks an environment uses. The wheels are per CPython version and platform
(``[tool.cibuildwheel]`` in pyproject.toml), not abi3: the extension uses static types with vectorcall and the
CPython tuple/list macros on its per-step path, outside the limited API before Python 3.12.
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
