"""Layout and line formats of a run recording (the one place the reader and writer agree on).

::

    <record_dir>/<run-id>/rank-<rank>/
        manifest.json   schema version, run id, resource, effective config, lifecycle times
        steps.jsonl     one compact timing record per step (exact percentiles offline)
        spans.jsonl     OTLP-JSON ExportTraceServiceRequest, one per line
        metrics.jsonl   OTLP-JSON ExportMetricsServiceRequest snapshots, one per line
        samples.jsonl   raw telemetry samples (every OTELPROF_SAMPLE_INTERVAL_MS)
        profiles.jsonl  one line per operator-profiling window: top CPU/GPU operators, activity mixes

``steps.jsonl`` records (times are integers in nanoseconds; ``t`` is Unix time):

* step: ``{"k":"s","ph":phase,"n":number,"t":start,"d":duration,"a":[[name,offset,duration,depth],...],
  "x":{scalar:value},"err":exception_type}`` (``a``, ``x``, ``err`` only when present)
* annotation outside steps: ``{"k":"a","name":...,"ph":phase_or_null,"t":start,"d":duration}``
* scalar outside steps: ``{"k":"x","name":...,"v":value,"ph":phase,"t":time}``
* phase switch: ``{"k":"p","ph":phase,"t":time}``
* device times of a step's regions, written when the GPU got there (after the step's own line; a step
  may get several): ``{"k":"d","ph":phase,"n":number,"a":[[name,duration],...]}`` (CUDA only)

``samples.jsonl`` records: blocks of samples (schema 1.3; :mod:`otelprof.recording.sample_packing`), each
``{"k":"b","t":"<int64 x n>","pid":pid,"c":[column,...],"gpu":{index:[key,...]},"same":[position,...],
"sv":"<float64 x len(same)>","v":"<float64 x n x (width - len(same))>","ncpu":k,"busy":"<float64 x cores>",
"niow":k,"iowait":"<float64 x cores>"}`` (base64 of little-endian values: the sample times, then each sample's
values of the named columns and GPU keys, NaN where missing, but the columns at ``same`` written once with their
one value; the per-CPU values reduced by the writer to each sample's mean and maximum and the block's per-CPU
sums), written every 20 samples or 10 s. Schema 1.2 wrote blocks of JSON lists,
``{"k":"b","t":[time,...],"pcpu":[...],...,"gpu":{index:{key:[...]}}}`` (``null`` where a sample lacks the key;
:mod:`otelprof.recording.sample_blocks`), recordings before 1.2 one sample per line; the reader reads all
three. A sample (a line before 1.2, and the keys of 1.2's lists):
``{"t":time,"pid":pid,"pcpu":process_cpu_ratio,"rss":bytes,
"cpu":[busy ratio per CPU],"iow":[iowait ratio per CPU],"mem":host_memory_ratio,"disk":[read_bytes,write_bytes],
"net":[received,transmitted],"thr":throttled_periods,"cws":container_working_set_bytes,"cml":container_memory_limit_bytes,
"gpu":{index:{"u":util,"mu":bytes,"mt":bytes,...}}}`` (node-wide keys only from the node sampler; ``cws`` with a
readable cgroup, ``cml`` only with a memory limit; GPU keys as ``GPU_SAMPLE_KEYS`` in the sampler).
"""

from __future__ import annotations

SCHEMA_VERSION = "1.3"
"""1.1: device-time lines (``"k":"d"``) in steps.jsonl. 1.2: samples.jsonl in blocks of samples. 1.3: the blocks'
numbers packed in binary, the per-CPU values reduced by the writer."""
SCHEMA_MAJOR = 1

MANIFEST = "manifest.json"
STEPS = "steps.jsonl"
SPANS = "spans.jsonl"
METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
PROFILES = "profiles.jsonl"

KIND_STEP = "s"
KIND_ANNOTATION = "a"
KIND_SCALAR = "x"
KIND_PHASE = "p"
KIND_DEVICE = "d"

STATUS_RUNNING = "running"
STATUS_FINISHED = "finished"

SIGTERM = "sigterm"
"""Manifest key: Unix seconds at which the process got SIGTERM (absent if it never did)."""

LIFECYCLE_EVENTS = ("process_start", "init", "first_step_start", "last_step_end", "shutdown")
"""Keys of ``manifest["lifecycle"]``: Unix times in seconds (null until they happen)."""


def rank_dir_name(rank: int) -> str:
    return f"rank-{rank}"
