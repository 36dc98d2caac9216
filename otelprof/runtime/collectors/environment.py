"""What the training process runs on, read once in ``init()`` as resource attributes.

Everything here is local and cheap (no network call, nothing that can block): the Python and OS
versions from the interpreter; the PyTorch version and the CUDA version it was built with from
``torch`` when it is imported, else from its ``version.py`` file (read as text: ``init()`` never
imports torch); the CPU model from ``/proc/cpuinfo``; the cloud provider and instance type from
the machine's DMI strings (``/sys/class/dmi/id``: AWS names the instance type there) or from
SageMaker's ``SM_CURRENT_INSTANCE_TYPE``; and the GPUs' model, count and driver versions through
the NVML seam the sampler already opened (:func:`gpu_attributes`).

The cloud metadata endpoint is never queried: a link-local HTTP call from every rank at start-up
can stall (no route: a connect timeout) or be refused by policy, for one label. Where neither DMI
nor the environment names the instance type (GCP, Azure, Kubernetes nodes: the downward API
cannot pass node labels to a pod), set it with ``OTEL_RESOURCE_ATTRIBUTES=host.type=<type>``,
which wins over everything detected here. Nothing here raises: an unreadable source leaves its
attribute out.
"""

from __future__ import annotations

import importlib.util
import platform
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from otelprof import semconv as sc

if TYPE_CHECKING:
    from otelprof.runtime.collectors.gpu import GpuCollector

DMI = Path("/sys/class/dmi/id")
CPUINFO = Path("/proc/cpuinfo")
SAGEMAKER_INSTANCE_TYPE = "SM_CURRENT_INSTANCE_TYPE"
"""Set by SageMaker in its training containers."""

_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64",
         "s390x": "s390x", "i686": "x86", "i386": "x86"}
"""``platform.machine()`` to OpenTelemetry's ``host.arch`` values."""
_CLOUDS = (("amazon", "aws"), ("google", "gcp"), ("microsoft corporation", "azure"), ("alibaba", "alibaba_cloud"),
           ("oraclecloud", "oracle_cloud"), ("tencent", "tencent_cloud"))
"""A DMI vendor string (lower case) containing the first to ``cloud.provider``."""
_TORCH_VERSION = re.compile(r"""^__version__\s*(?::[^=]*)?=\s*['"]([^'"]+)['"]""", re.M)
_TORCH_CUDA = re.compile(r"""^cuda\s*(?::[^=]*)?=\s*(?:['"]([^'"]+)['"]|None)""", re.M)
NO_CUDA = "none"
"""``otelprof.torch.cuda_version`` of a CPU-only PyTorch build."""


def software_attributes() -> dict[str, str]:
    """Python, OS and PyTorch versions."""
    attrs = {sc.PROCESS_RUNTIME_NAME: sys.implementation.name, sc.PROCESS_RUNTIME_VERSION: platform.python_version(),
             sc.OS_TYPE: sys.platform if sys.platform != "win32" else "windows"}
    try:
        attrs[sc.OS_VERSION] = platform.release()
        arch = platform.machine()
        if arch:
            attrs[sc.HOST_ARCH] = _ARCH.get(arch.lower(), arch.lower())
        attrs.update(torch_attributes())
    except Exception:  # an odd platform: what was found so far is kept
        pass
    return {k: v for k, v in attrs.items() if v}


def torch_attributes() -> dict[str, str]:
    """PyTorch's version and the CUDA version it was built with, without importing it."""
    torch = sys.modules.get("torch")
    version = getattr(torch, "__version__", None) if torch is not None else None
    if version is not None:
        cuda = getattr(getattr(torch, "version", None), "cuda", None)
        return {sc.OTELPROF_TORCH_VERSION: str(version), sc.OTELPROF_TORCH_CUDA: str(cuda or NO_CUDA)}
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return {}
    if spec is None or not spec.submodule_search_locations:
        return {}
    for location in spec.submodule_search_locations:
        try:
            text = (Path(location) / "version.py").read_text(encoding="utf-8", errors="replace")[:20_000]
        except OSError:
            continue
        found = _TORCH_VERSION.search(text)
        if found is None:
            continue
        cuda = _TORCH_CUDA.search(text)
        return {sc.OTELPROF_TORCH_VERSION: found.group(1),
                sc.OTELPROF_TORCH_CUDA: (cuda.group(1) or NO_CUDA) if cuda else NO_CUDA}
    return {}


def machine_attributes(env: Mapping[str, str], dmi: Path = DMI, cpuinfo: Path = CPUINFO) -> dict[str, str]:
    """CPU model, cloud provider and instance type (``host.type``) where the machine tells them."""
    attrs: dict[str, str] = {}
    model = _cpu_model(cpuinfo)
    if model:
        attrs[sc.HOST_CPU_MODEL] = model
    vendor = " ".join(filter(None, (_read(dmi / "sys_vendor"), _read(dmi / "board_vendor"),
                                    _read(dmi / "chassis_asset_tag")))).lower()
    provider = next((name for key, name in _CLOUDS if key in vendor), "")
    if provider:
        attrs[sc.CLOUD_PROVIDER] = provider
    instance_type = env.get(SAGEMAKER_INSTANCE_TYPE, "").strip()
    if instance_type:
        attrs[sc.CLOUD_PROVIDER] = "aws"
    elif provider == "aws":  # EC2 Nitro instances: product_name is the instance type ("p4d.24xlarge")
        product = _read(dmi / "product_name")
        if product and "." in product and " " not in product:
            instance_type = product
    if instance_type:
        attrs[sc.HOST_TYPE] = instance_type[:128]
    return attrs


def gpu_attributes(collector: GpuCollector | None) -> dict[str, str | int]:
    """Model and count of the GPUs the process sees, the NVIDIA driver's version and the CUDA version it
    supports, from the sampler's NVML seam (nothing when NVML is off or unavailable; never a warning)."""
    if collector is None or collector.backend is None:
        return {}
    attrs: dict[str, str | int] = {sc.OTELPROF_GPU_COUNT: len(collector.devices)}
    models = sorted({d.name for d in collector.devices if d.name})
    if models:
        attrs[sc.OTELPROF_GPU_MODEL] = ", ".join(models)[:256]
    try:
        driver, cuda = collector.backend.versions()
    except Exception:  # an old driver or binding: the versions stay unknown
        return attrs
    if driver:
        attrs[sc.OTELPROF_GPU_DRIVER] = str(driver)[:64]
    if cuda:
        attrs[sc.OTELPROF_CUDA_DRIVER] = str(cuda)[:64]
    return attrs


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[:256].strip()
    except OSError:
        return ""


def _cpu_model(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle):
                if number > 64:  # the first processor's block holds it, if anything does
                    break
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model Name", "cpu model"):
                    return " ".join(value.split())[:128]
    except OSError:
        pass
    return ""
