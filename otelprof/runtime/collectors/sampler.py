"""The sampler thread: every ``sample_interval`` it reads host, container, process and GPUs,
updates gauges, utilization histograms and the per-sample coincidence counters, and
appends the raw sample to the recording.

Coincidences are judged per sample (ARCHITECTURE principle 2): the CPU-bottleneck
counter grows when, in the same sample, some CPU is above the CPU threshold and some
GPU is below the GPU threshold. ``rate()`` of these counters over ``rate()`` of
``otelprof.sampler.samples`` is the exact fraction, whatever the scrape interval.
A tick that overruns its interval makes the next ones skip (counted), never queue.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from otelprof import semconv as sc
from otelprof._log import logger, warn_once
from otelprof.config import Config
from otelprof.recording.writer import RecordingWriter
from otelprof.runtime.collectors.cgroup import CgroupReader, CgroupReading
from otelprof.runtime.collectors.gpu import GpuCollector, GpuReading
from otelprof.runtime.collectors.nvml import THROTTLE_REASONS, DeviceInfo, NvmlBackend, PynvmlBackend
from otelprof.runtime.collectors.system import HostReading, ProcessReading, SystemCollector, affinity_cpus
from otelprof.runtime.metrics import MetricRegistry

_GPU_GAUGES = {
    "utilization": sc.GPU_UTILIZATION, "memory_copy_utilization": sc.GPU_MEMORY_COPY_UTILIZATION,
    "memory_used": sc.GPU_MEMORY_USAGE, "memory_total": sc.GPU_MEMORY_LIMIT, "power": sc.GPU_POWER,
    "power_limit": sc.GPU_POWER_LIMIT, "temperature": sc.GPU_TEMPERATURE, "sm_clock": sc.GPU_SM_CLOCK,
    "sm_active": sc.GPU_SM_ACTIVE, "sm_occupancy": sc.GPU_SM_OCCUPANCY, "tensor_active": sc.GPU_TENSOR_ACTIVE,
}
# Short keys of the raw GPU sample in samples.jsonl.
GPU_SAMPLE_KEYS = {
    "utilization": "u", "memory_copy_utilization": "mc", "memory_used": "mu", "memory_total": "mt",
    "power": "p", "power_limit": "pl", "temperature": "t", "sm_clock": "clk", "pcie_rx": "rx", "pcie_tx": "tx",
    "throttle_reasons": "thr", "ecc_corrected": "eccc", "ecc_uncorrected": "eccu", "sm_active": "sm",
    "sm_occupancy": "occ", "tensor_active": "tc",
}


class Sampler:
    def __init__(
        self,
        config: Config,
        registry: MetricRegistry,
        writer: RecordingWriter | None,
        nvml_factory: Callable[[], NvmlBackend] | None = PynvmlBackend,
        cgroup: CgroupReader | None = None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.writer = writer
        self.node_wide = config.samples_node
        self.interval = config.sample_interval
        self._stop = threading.Event()
        r = registry
        self.errors = r.counter(sc.SAMPLER_ERRORS)
        self.overruns = r.counter(sc.SAMPLER_OVERRUNS)
        self.time_spent = r.counter(sc.SAMPLER_TIME)
        self.system = SystemCollector(self._error)
        self.cgroup = cgroup if cgroup is not None else CgroupReader()
        self.gpus = (GpuCollector(self._error, nvml_factory, warn=config.samples_node)
                     if config.gpu_metrics and nvml_factory is not None else None)
        if self.gpus is not None:
            self._set_gpu_info(self.gpus, config)
            if not config.gpu_sampling:  # dcgm-exporter samples the GPUs: NVML was only asked who they are
                self.gpus.shutdown()
                self.gpus = None
        self._thread: threading.Thread | None = None
        self._logged_internal = False
        self.samples_taken = 0

    def _set_gpu_info(self, gpus: GpuCollector, config: Config) -> None:
        """``otelprof_gpu_info`` for the GPU this process computes on: the one visible GPU or MIG instance, else
        the one at ``LOCAL_RANK`` (what ``cuda:LOCAL_RANK`` names); ``otelprof_gpu_unmapped`` when the process
        was given a GPU but that cannot be told (warned once)."""
        device, unmapped = gpus.device_for(config.local_rank)
        with self.registry.lock:
            if device is not None:
                self.registry.gauge(sc.GPU_INFO).set(1, _info_labels(device, config))
            elif unmapped:
                self.registry.gauge(sc.GPU_UNMAPPED).set(1, (unmapped,))
        if unmapped:
            visible = ",".join(gpus.selectors) if gpus.selectors is not None else "all"
            warn_once("gpu:unmapped", "otelprof: this process was given a GPU (visible devices %r) but cannot tell "
                      "which it computes on (%s); its GPU is not monitored", visible[:200], unmapped)

    def _error(self, source: str, reason: str) -> None:
        with self.registry.lock:
            self.errors.add(1, (source, reason))

    def start(self) -> None:
        self.sample()  # baseline for the per-interval ratios
        self._thread = threading.Thread(target=self._run, name="otelprof-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_tick = time.monotonic() + self.interval
        while not self._stop.wait(max(next_tick - time.monotonic(), 0.0)):
            self.sample()
            next_tick += self.interval
            now = time.monotonic()
            if now > next_tick:  # overran: skip the ticks we missed instead of queueing them
                missed = int((now - next_tick) // self.interval) + 1
                next_tick += missed * self.interval
                with self.registry.lock:
                    self.overruns.add(missed)

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.gpus is not None:
            self.gpus.shutdown()

    def sample(self) -> None:
        """Take one sample now. Never raises."""
        began = time.perf_counter()
        try:
            self._sample()
        except Exception:
            self._error("sampler", "internal")
            if not self._logged_internal:
                self._logged_internal = True
                logger.exception("otelprof: internal error in the sampler (counted from now on)")
        with self.registry.lock:
            self.time_spent.add(time.perf_counter() - began)

    def _sample(self) -> None:
        now = time.time()
        cgroup = self._read_cgroup()
        available = _available_cpus(cgroup)
        process = self.system.process(available, now)
        host = self.system.host() if self.node_wide else None
        gpus = self.gpus.sample(self.node_wide) if self.gpus is not None else []
        with self.registry.lock:
            self._update_process(process, gpus)
            if self.node_wide:
                assert host is not None
                self._update_host(host, cgroup, available)
                self._update_gpus(gpus)
                if host.cpu_busy:  # the first sample only sets the baseline
                    self._update_coincidences(host, gpus)
        self.samples_taken += 1
        if self.writer is not None and (host is None or host.cpu_busy):
            self.writer.add_sample(_raw_sample(now, host, process, gpus, cgroup))

    def _read_cgroup(self) -> CgroupReading | None:
        if not self.cgroup.available:
            return None
        try:
            return self.cgroup.read()
        except Exception:
            self._error("cgroup", "error")
            return None

    def _update_process(self, process: ProcessReading, gpus: list[GpuReading]) -> None:
        r = self.registry
        if process.cpu_user is not None and process.cpu_system is not None:
            cpu_time = r.counter(sc.PROCESS_CPU_TIME)
            cpu_time.set_total(process.cpu_user, ("user",))
            cpu_time.set_total(process.cpu_system, ("system",))
        _set_or_remove(r.gauge(sc.PROCESS_CPU_UTILIZATION), process.cpu_utilization)
        _set_or_remove(r.gauge(sc.PROCESS_MEMORY_USAGE), process.rss)
        _set_or_remove(r.gauge(sc.PROCESS_THREAD_COUNT), process.threads)
        gpu_memory = r.gauge(sc.PROCESS_GPU_MEMORY)
        gpu_memory.values.clear()
        for reading in gpus:
            if reading.process_memory is not None:
                gpu_memory.set(reading.process_memory, _gpu_labels(reading))

    def _update_host(self, host: HostReading, cgroup: CgroupReading | None, available: float) -> None:
        r = self.registry
        cpu = r.gauge(sc.SYSTEM_CPU_UTILIZATION)
        for core, modes in _cpu_rows(host, self.config.per_cpu_max):
            for mode, ratio in modes.items():
                cpu.set(ratio, (core, mode))
        if host.cpu_busy:
            r.histogram(sc.NODE_CPU_UTILIZATION).observe(sum(host.cpu_busy) / len(host.cpu_busy))
        r.gauge(sc.CPU_AVAILABLE).set(available)
        if host.memory_total:
            r.gauge(sc.SYSTEM_MEMORY_LIMIT).set(host.memory_total)
        if host.memory_used is not None and host.memory_total:
            r.gauge(sc.SYSTEM_MEMORY_USAGE).set(host.memory_used)
            r.gauge(sc.SYSTEM_MEMORY_UTILIZATION).set(host.memory_used / host.memory_total)
        if host.disk is not None:
            io, ops = r.counter(sc.SYSTEM_DISK_IO), r.counter(sc.SYSTEM_DISK_OPERATIONS)
            io.set_total(host.disk["read_bytes"], ("read",))
            io.set_total(host.disk["write_bytes"], ("write",))
            ops.set_total(host.disk["read_count"], ("read",))
            ops.set_total(host.disk["write_count"], ("write",))
        if host.network is not None:
            net = r.counter(sc.SYSTEM_NETWORK_IO)
            net.set_total(host.network["bytes_recv"], ("receive",))
            net.set_total(host.network["bytes_sent"], ("transmit",))
        if cgroup is not None:
            _set_or_remove(r.gauge(sc.CONTAINER_CPU_LIMIT), cgroup.cpu_limit_cores)
            _set_or_remove(r.gauge(sc.CONTAINER_MEMORY_LIMIT), cgroup.memory_limit_bytes)
            _set_or_remove(r.gauge(sc.CONTAINER_MEMORY_USAGE), cgroup.memory_usage_bytes)
            _set_or_remove(r.gauge(sc.CONTAINER_MEMORY_WORKING_SET), cgroup.memory_working_set_bytes)
            for spec, value in ((sc.CONTAINER_CPU_TIME, cgroup.cpu_usage_seconds),
                                (sc.CONTAINER_CPU_PERIODS, cgroup.periods),
                                (sc.CONTAINER_CPU_THROTTLED_PERIODS, cgroup.throttled_periods),
                                (sc.CONTAINER_CPU_THROTTLED_TIME, cgroup.throttled_seconds)):
                if value is not None:
                    r.counter(spec).set_total(value)

    def _update_gpus(self, gpus: list[GpuReading]) -> None:
        r = self.registry
        seen = {_gpu_labels(g) for g in gpus}
        for spec in (*_GPU_GAUGES.values(), sc.GPU_MEMORY_UTILIZATION):
            gauge = r.gauge(spec)
            lost = [k for k in gauge.values if k[:len(sc.GPU_LABELS)] not in seen]
            for labels in lost:  # a lost GPU's series go absent
                gauge.remove(labels)
        for reading in gpus:
            labels = _gpu_labels(reading)
            values = reading.values
            for name, spec in _GPU_GAUGES.items():
                gauge = r.gauge(spec)
                point = _hw_labels(spec, labels)
                if name in values:
                    gauge.set(values[name], point)
                else:
                    gauge.remove(point)
            if "utilization" in values:
                r.histogram(sc.GPU_UTILIZATION_DISTRIBUTION).observe(values["utilization"], labels)
            memory = r.gauge(sc.GPU_MEMORY_UTILIZATION)
            if "memory_used" in values and values.get("memory_total"):
                ratio = values["memory_used"] / values["memory_total"]
                memory.set(ratio, labels)
                r.histogram(sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION).observe(ratio, labels)
            else:
                memory.remove(labels)
            pcie = r.gauge(sc.GPU_PCIE_THROUGHPUT)
            for key, direction in (("pcie_rx", "receive"), ("pcie_tx", "transmit")):
                if key in values:
                    pcie.set(values[key], (*labels, direction))
            if "throttle_reasons" in values:
                mask = int(values["throttle_reasons"])
                throttle = r.gauge(sc.GPU_THROTTLE)
                for bit, reason in THROTTLE_REASONS.items():
                    throttle.set(1 if mask & bit else 0, (*labels, reason))
            if "energy" in values:
                r.counter(sc.GPU_ENERGY).set_total(values["energy"], _hw_labels(sc.GPU_ENERGY, labels))
            errors = r.counter(sc.GPU_ERRORS)
            for key, kind in (("ecc_corrected", "corrected"), ("ecc_uncorrected", "uncorrected")):
                if key in values:
                    errors.set_total(values[key], (*_hw_labels(sc.GPU_ERRORS, labels), kind))

    def _update_coincidences(self, host: HostReading, gpus: list[GpuReading]) -> None:
        r = self.registry
        config = self.config
        r.counter(sc.SAMPLER_SAMPLES).add(1)
        high_cpu = max(host.cpu_busy) > config.cpu_high_threshold
        high_io = bool(host.cpu_iowait) and max(host.cpu_iowait) > config.iowait_high_threshold
        utilizations = [g.values["utilization"] for g in gpus if "utilization" in g.values]
        low_gpu = bool(utilizations) and min(utilizations) < config.gpu_low_threshold
        # Zero-valued series exist from the first sample: absent would read as "no data", not "no bottleneck".
        for spec, hit in ((sc.SAMPLER_HIGH_CPU, high_cpu), (sc.SAMPLER_LOW_GPU, low_gpu),
                          (sc.SAMPLER_CPU_BOTTLENECK, high_cpu and low_gpu),
                          (sc.SAMPLER_IO_BOTTLENECK, high_io and low_gpu)):
            r.counter(spec).add(1 if hit else 0)


def _cpu_rows(host: HostReading, per_cpu_max: int) -> list[tuple[str, dict[str, float]]]:
    """The ``cpu`` label and modes of each exported row: every CPU up to ``per_cpu_max`` CPUs, else the busiest."""
    if len(host.cpu_modes) <= per_cpu_max:
        return [(str(index), modes) for index, modes in enumerate(host.cpu_modes)]
    if not host.cpu_busy:
        return []
    busiest = max(range(len(host.cpu_busy)), key=host.cpu_busy.__getitem__)
    return [(sc.CPU_BUSIEST, host.cpu_modes[busiest])]


def _set_or_remove(gauge: object, value: float | int | None) -> None:
    from otelprof.runtime.metrics import GaugeInstrument

    assert isinstance(gauge, GaugeInstrument)
    if value is None:
        gauge.remove(())
    else:
        gauge.set(value)


def _gpu_labels(reading: GpuReading) -> tuple[str, str]:
    return (reading.device.gpu, reading.device.uuid)


def _info_labels(device: DeviceInfo, config: Config) -> tuple[str, ...]:
    """``otelprof_gpu_info``'s label values: the GPU, its MIG identity, and the pod (the OTLP path's join key)."""
    instance = str(device.gpu_instance) if device.is_mig and device.gpu_instance >= 0 else ""
    return (device.gpu, device.uuid, device.parent_uuid, instance, device.profile, config.pod_name or "",
            config.pod_namespace or "")


def _hw_labels(spec: sc.MetricSpec, labels: tuple[str, ...]) -> tuple[str, ...]:
    """A GPU's label values for ``spec``: the generic ``hw.*`` metrics also say ``hw.type`` = gpu."""
    return (*labels, sc.HW_TYPE_GPU) if sc.LABEL_HW_TYPE in spec.labels else labels


def _available_cpus(cgroup: CgroupReading | None) -> float:
    cpus = float(affinity_cpus())
    if cgroup is not None and cgroup.cpu_limit_cores is not None:
        return min(cpus, cgroup.cpu_limit_cores)
    return cpus


def _raw_sample(now: float, host: HostReading | None, process: ProcessReading, gpus: list[GpuReading],
                cgroup: CgroupReading | None) -> dict[str, object]:
    """One line of samples.jsonl (see :mod:`otelprof.recording.schema`)."""
    line: dict[str, object] = {"t": int(now * 1e9), "pid": os.getpid()}
    if process.cpu_utilization is not None:
        line["pcpu"] = round(process.cpu_utilization, 4)
    if process.rss is not None:
        line["rss"] = process.rss
    if host is not None:
        line["cpu"] = [round(v, 4) for v in host.cpu_busy]
        line["iow"] = [round(v, 4) for v in host.cpu_iowait]
        if host.memory_used is not None and host.memory_total:
            line["mem"] = round(host.memory_used / host.memory_total, 4)
        if host.disk is not None:
            line["disk"] = [host.disk["read_bytes"], host.disk["write_bytes"]]
        if host.network is not None:
            line["net"] = [host.network["bytes_recv"], host.network["bytes_sent"]]
        if cgroup is not None and cgroup.throttled_periods is not None:
            line["thr"] = cgroup.throttled_periods
        if cgroup is not None and cgroup.memory_working_set_bytes is not None:
            line["cws"] = cgroup.memory_working_set_bytes
            if cgroup.memory_limit_bytes is not None:
                line["cml"] = cgroup.memory_limit_bytes
        gpu_lines = {}
        for reading in gpus:
            entry: dict[str, float] = {GPU_SAMPLE_KEYS[k]: round(v, 4) for k, v in reading.values.items()
                                       if k in GPU_SAMPLE_KEYS}
            if reading.process_memory is not None:
                entry["pm"] = reading.process_memory
            gpu_lines[reading.device.gpu] = entry
        if gpu_lines:
            line["gpu"] = gpu_lines
    return line

