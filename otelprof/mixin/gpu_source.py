"""Where the GPU checks read GPU readings: otelprof's own NVML series, or dcgm-exporter's (``gpu_source``).

With ``gpu_source=dcgm`` the recording group ``otelprof-dcgm`` turns dcgm-exporter's ``DCGM_FI_DEV_*`` series into
otelprof's GPU series in base units (ratio 0-1, bytes, hertz), named ``otelprof:<otelprof series>:dcgm`` and
carrying the training job's identity labels and the otelprof series' own (``hw_type="gpu"`` on the generic ``hw.*``
metrics). They are joined to the ranks through the pod and the GPU: dcgm's ``UUID`` is the GPU's, also on a MIG
instance's series, which adds ``GPU_I_ID``; so the key is (``UUID``, ``GPU_I_ID``) = ``otelprof_gpu_info``'s
(``hw_id``, "") of a whole GPU or (``hw_parent``, ``gpu_instance``) of a MIG instance — never ``gpu``, whose index
differs between the container and the host. ``gpu`` and ``hw_id`` on the result are the rank's (the index in the
training container; a MIG instance's own UUID). The pod is the scrape target's ``pod`` label, or the info's
``k8s_pod_name`` when the ranks push OTLP through a collector (no target labels).

dcgm-exporter does not report ``DCGM_FI_DEV_GPU_UTIL`` for a MIG instance: utilization falls back to
``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (the share of time the instance's graphics engine ran a kernel). Beyond the
default counters' basics the records map PCIe bytes, SM activity and occupancy (the device-wide view of what PyTorch
Profiler shows as SM efficiency and achieved occupancy), tensor-pipe activity, energy, XID errors, remapped rows and
(when enabled in the exporter's counters) volatile ECC errors.

The alerts and recording rules ask :class:`GpuReadings` for a quantile / mean over a window; from otelprof's series
that is the per-sample histogram (exact, every 500 ms), from dcgm-exporter's the scraped gauge
(``quantile_over_time`` / ``avg_over_time`` of the scrapes).
"""

from __future__ import annotations

from dataclasses import dataclass

from otelprof import dcgm_series as ds
from otelprof import semconv as sc
from otelprof.mixin.config import GPU_SOURCE_DCGM, MixinConfig
from otelprof.mixin.promql import GPU, HW_ID, HW_TYPE, IDENTITY, Q, by, series_name
from otelprof.semconv import MetricSpec

GROUP = "otelprof-dcgm"
POD = "pod"
NAMESPACE = "namespace"
MIB = 2**20
GPU_KEY = "otelprof_gpu_uuid"
"""Join key: the GPU's UUID (dcgm's ``UUID``; the info's ``hw_parent`` of a MIG instance, else its ``hw_id``)."""
INSTANCE = sc.prometheus_label(sc.LABEL_GPU_INSTANCE)
HW_PARENT = sc.prometheus_label(sc.LABEL_HW_PARENT)
DIRECTION = sc.prometheus_label(sc.LABEL_NETWORK_DIRECTION)
ERROR_TYPE = sc.prometheus_label(sc.LABEL_ERROR_TYPE)


@dataclass(frozen=True)
class DcgmRecord:
    spec: MetricSpec
    """The otelprof series this record stands for."""
    expr: str
    """Over dcgm-exporter's series (``{s}`` is the dcgm selector), in the spec's base unit."""
    keep: tuple[str, ...] = ()
    """Labels of the spec besides the GPU's that ``expr`` sets (direction, error type)."""

    @property
    def name(self) -> str:
        return f"otelprof:{self.spec.prometheus_name}:dcgm"


def _labelled(label: str, sources: tuple[tuple[str, str], ...]) -> str:
    """dcgm series, each with ``label`` set to its value: one otelprof series with a label per dcgm field."""
    return " or ".join(f'label_replace({name}{{s}}, "{label}", "{value}", "", "")' for name, value in sources)


def _total_mib() -> str:
    used = ds.DCGM_FB_USED + "{s}"
    return f"({used} + {ds.DCGM_FB_FREE}{{s}} + ({ds.DCGM_FB_RESERVED}{{s}} or {used} * 0))"


DCGM_RECORDS: tuple[DcgmRecord, ...] = (
    # a MIG instance has no DCGM_FI_DEV_GPU_UTIL: its graphics engine activity stands in
    DcgmRecord(sc.GPU_UTILIZATION, f"{ds.DCGM_GPU_UTIL}{{s}} / 100 or {ds.DCGM_GR_ENGINE_ACTIVE}{{s}} * 1"),
    DcgmRecord(sc.GPU_MEMORY_COPY_UTILIZATION, f"{ds.DCGM_MEM_COPY_UTIL}{{s}} / 100"),
    DcgmRecord(sc.GPU_MEMORY_USAGE, f"{ds.DCGM_FB_USED}{{s}} * {MIB}"),
    DcgmRecord(sc.GPU_MEMORY_LIMIT, f"{_total_mib()} * {MIB}"),
    DcgmRecord(sc.GPU_MEMORY_UTILIZATION, f"{ds.DCGM_FB_USED}{{s}} / {_total_mib()}"),
    DcgmRecord(sc.GPU_POWER, f"{ds.DCGM_POWER_USAGE}{{s}}"),
    DcgmRecord(sc.GPU_TEMPERATURE, f"{ds.DCGM_GPU_TEMP}{{s}}"),
    DcgmRecord(sc.GPU_SM_CLOCK, f"{ds.DCGM_SM_CLOCK}{{s}} * 1000000"),
    DcgmRecord(sc.GPU_TENSOR_ACTIVE, f"{ds.DCGM_TENSOR_ACTIVE}{{s}}"),
    DcgmRecord(sc.GPU_SM_ACTIVE, f"{ds.DCGM_SM_ACTIVE}{{s}}"),
    DcgmRecord(sc.GPU_SM_OCCUPANCY, f"{ds.DCGM_SM_OCCUPANCY}{{s}}"),
    DcgmRecord(sc.GPU_PCIE_THROUGHPUT, _labelled(DIRECTION, ((ds.DCGM_PCIE_RX_BYTES, "receive"),
                                                            (ds.DCGM_PCIE_TX_BYTES, "transmit"))), (DIRECTION,)),
    DcgmRecord(sc.GPU_ENERGY, f"{ds.DCGM_TOTAL_ENERGY}{{s}} / 1000"),
    DcgmRecord(sc.GPU_ERRORS, _labelled(ERROR_TYPE, ((ds.DCGM_ECC_SBE_VOLATILE, "corrected"),
                                                     (ds.DCGM_ECC_DBE_VOLATILE, "uncorrected"))), (ERROR_TYPE,)),
    DcgmRecord(sc.GPU_XID, f"{ds.DCGM_XID_ERRORS}{{s}}"),
    DcgmRecord(sc.GPU_REMAPPED_ROWS, _labelled(ERROR_TYPE, ((ds.DCGM_CORRECTABLE_REMAPPED_ROWS, "correctable"),
                                                            (ds.DCGM_UNCORRECTABLE_REMAPPED_ROWS, "uncorrectable"))),
               (ERROR_TYPE,)),
)
RECORD_BY_SERIES = {series_name(r.spec): r.name for r in DCGM_RECORDS}
"""otelprof's GPU series name -> the dcgm record standing for it (what the dashboards read in dcgm mode)."""

_DISTRIBUTIONS = {sc.GPU_UTILIZATION: sc.GPU_UTILIZATION_DISTRIBUTION,
                  sc.GPU_MEMORY_UTILIZATION: sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION}


def _relabel(expr: str, target: str, source: str) -> str:
    if target == source:
        return expr
    return f'label_replace({expr}, "{target}", "$1", "{source}", "(.+)")'


def joined(c: MixinConfig, expr: str, keep: tuple[str, ...] = ()) -> str:
    """dcgm-exporter's ``expr`` with the training job's identity: joined on (namespace, pod, GPU UUID, GPU
    instance) to the rank whose ``otelprof_gpu_info`` names that GPU or MIG instance; ``gpu`` becomes the index in
    the training container, ``hw_id`` the rank's (a MIG instance's own UUID)."""
    dcgm = _relabel(_relabel(_relabel(_relabel(f"({expr})", GPU_KEY, ds.DCGM_LABEL_UUID), INSTANCE,
                                      ds.DCGM_LABEL_GPU_INSTANCE), POD, c.dcgm_pod_label),
                    NAMESPACE, c.dcgm_namespace_label)
    keys = (NAMESPACE, POD, GPU_KEY, INSTANCE)
    copied = (*IDENTITY, GPU, HW_ID)
    return (f"max by ({by(*IDENTITY, GPU, HW_ID, *keep)}) (\n  {dcgm}\n"
            f"  * on ({by(*keys)}) group_left ({by(*copied)})\n"
            f"  max by ({by(*keys, *copied)}) ({info_keyed(c)})\n)")


def info_keyed(c: MixinConfig) -> str:
    """``otelprof_gpu_info`` with the join keys: the GPU's UUID, and the pod/namespace from ``k8s_pod_name`` /
    ``k8s_namespace_name`` where the series carries them (the OTLP path), else the scrape target's."""
    info = Q(c.selector).sel(sc.GPU_INFO)
    keyed = _relabel(_relabel(info, GPU_KEY, HW_ID), GPU_KEY, HW_PARENT)
    keyed = _relabel(keyed, POD, sc.prometheus_label(sc.K8S_POD_NAME))
    return _relabel(keyed, NAMESPACE, sc.prometheus_label(sc.K8S_NAMESPACE_NAME))


def _hw_type(spec: MetricSpec, expr: str) -> str:
    """``expr`` with ``hw_type="gpu"`` when otelprof's series of ``spec`` carries it (``hw.power``, ...)."""
    if sc.LABEL_HW_TYPE not in spec.labels:
        return expr
    return f'label_replace({expr}, "{HW_TYPE}", "{sc.HW_TYPE_GPU}", "", "")'


def dcgm_rules(c: MixinConfig) -> list[dict[str, str]]:
    selector = c.dcgm_selector.strip()
    rules = []
    for record in DCGM_RECORDS:
        expr = record.expr.replace("{s}", f"{{{selector}}}" if selector else "")
        rules.append({"record": record.name, "expr": _hw_type(record.spec, joined(c, expr, record.keep))})
    return rules


def record_name(spec: MetricSpec) -> str:
    for record in DCGM_RECORDS:
        if record.spec == spec:
            return record.name
    raise KeyError(spec.name)


class GpuReadings:
    """GPU readings per GPU of the job, from the configured source, with the job's identity labels."""

    def __init__(self, c: MixinConfig) -> None:
        self.dcgm = c.gpu_source == GPU_SOURCE_DCGM
        self.q = Q(c.selector)

    def current(self, spec: MetricSpec) -> str:
        """The latest reading of a GPU gauge (``hw_gpu_utilization_ratio``, ...)."""
        return record_name(spec) if self.dcgm else self.q.sel(spec)

    def quantile(self, quantile: float, spec: MetricSpec, window: str) -> str:
        """The ``quantile`` of the readings of ``spec`` (utilization or memory utilization) over ``window``."""
        if self.dcgm:
            return f"quantile_over_time({quantile}, {record_name(spec)}[{window}])"
        return self.q.window_quantile(quantile, _DISTRIBUTIONS[spec], window)

    def mean(self, spec: MetricSpec, window: str, offset: str = "") -> str:
        """The mean of the readings of ``spec`` over ``window`` (ending ``offset`` ago)."""
        if self.dcgm:
            shift = f" offset {offset}" if offset else ""
            return f"avg_over_time({record_name(spec)}[{window}]{shift})"
        return self.q.window_mean(_DISTRIBUTIONS[spec], window, offset=offset)
