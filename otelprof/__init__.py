"""otelprof: training-job profiling and bottleneck alerting on OpenTelemetry and Prometheus.

>>> import otelprof
>>> with otelprof.init(job_name="resnet"):
...     for batch in loader:
...         with otelprof.step():
...             with otelprof.annotate("forward"):
...                 loss = model(batch)
...             otelprof.record("loss", loss)
"""

from otelprof._version import __version__
from otelprof.config import Config, ConfigError
from otelprof.runtime import extensions as _extensions
from otelprof.runtime import profile_schedule as _profile_schedule
from otelprof.runtime._stop_exit import STOP_EXIT_STATUS
from otelprof.runtime.hotpath import StopTraining, annotate, annotation_begin, annotation_end, phase, record, step
from otelprof.runtime.session import Session, get_session, init, shutdown

# The composition root: the runtime core offers hooks; every session runs the periodic profiling schedule, and
# PyTorch's profiler loads (and registers with the schedule) once torch is imported. No integration is imported here.
_extensions.register(_profile_schedule.start)
_extensions.load_when_imported("torch", "otelprof.integrations.torch_profiler")

__all__ = [
    "STOP_EXIT_STATUS",
    "Config",
    "ConfigError",
    "Session",
    "StopTraining",
    "__version__",
    "annotate",
    "annotation_begin",
    "annotation_end",
    "get_session",
    "init",
    "phase",
    "record",
    "shutdown",
    "step",
]
