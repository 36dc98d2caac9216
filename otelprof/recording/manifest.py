"""Reading a rank's manifest.json and checking it field by field against what the writer writes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from otelprof.recording import schema
from otelprof.recording.errors import RecordingError
from otelprof.recording.files import open_regular, reason
from otelprof.recording.limits import MAX_MANIFEST_BYTES, MAX_STRING_CHARS, MAX_TIME_NS, loads


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 2**31


def _is_seconds(value: Any) -> bool:
    return value is None or (type(value) in (int, float) and 0 <= value <= MAX_TIME_NS / 1e9)


def _is_string(value: Any) -> bool:
    return type(value) is str and len(value) <= MAX_STRING_CHARS


_MANIFEST_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "run_id": ("a string", _is_string),
    "status": ("a string", _is_string),
    "otelprof_version": ("a string", _is_string),
    "rank": ("an integer from 0 to 2^31 - 1", _is_count),
    "local_rank": ("an integer from 0 to 2^31 - 1", _is_count),
    "world_size": ("an integer from 0 to 2^31 - 1", _is_count),
    "resource": ("an object", lambda v: type(v) is dict),
    "dropped": ("an object", lambda v: type(v) is dict),
    "config": ("an object", lambda v: type(v) is dict),
    "lifecycle": ("an object", lambda v: type(v) is dict),
}
"""What the writer puts in the manifest and the tools read: a manifest with another type there is not
read (an absent field takes its default)."""
_CONFIG_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "job_name": ("a string", _is_string),
    "outlier_sigma": ("a number from 0 to 1000", lambda v: type(v) in (int, float) and 0 <= v <= 1000),
    "outlier_min_steps": ("an integer from 0 to 2^31 - 1", _is_count),
    "outlier_min_ratio": ("a number from 1 to 100", lambda v: type(v) in (int, float) and 1 <= v <= 100),
    "outlier_min_excess": ("a number from 0 to 3600", lambda v: type(v) in (int, float) and 0 <= v <= 3600),
}


def read_manifest(path: Path) -> dict[str, Any]:
    """The rank's manifest, checked field by field (RecordingError: the rank cannot be read)."""
    file = path / schema.MANIFEST
    try:
        with open_regular(file) as handle:
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError as exc:
        raise RecordingError(f"{path} has no {schema.MANIFEST}: not an otelprof recording") from exc
    except OSError as exc:
        raise RecordingError(f"cannot read {file}: {reason(exc)}") from exc
    if len(raw) > MAX_MANIFEST_BYTES:
        raise RecordingError(f"{file} is larger than {MAX_MANIFEST_BYTES // 1024} KiB: not an otelprof manifest")
    try:
        manifest = loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise RecordingError(f"cannot read {file}: {exc}") from exc
    if type(manifest) is not dict:
        raise RecordingError(f"{file} is not a JSON object: not an otelprof manifest")
    version = manifest.get("schema_version", "")
    try:
        major = int(version.split(".")[0]) if _is_string(version) else None
    except ValueError:
        major = None
    if major is None:
        raise RecordingError(f"{file} has no valid schema_version ({str(version)[:40]!r})")
    if major != schema.SCHEMA_MAJOR:
        raise RecordingError(
            f"{path} uses recording schema {version[:40]}; this otelprof reads {schema.SCHEMA_MAJOR}.x — "
            "use a matching otelprof version")
    config, lifecycle = manifest.get("config"), manifest.get("lifecycle")
    checks = [(key, manifest.get(key), what, valid) for key, (what, valid) in _MANIFEST_FIELDS.items()]
    checks += [(f"config.{key}", config.get(key) if type(config) is dict else None, what, valid)
               for key, (what, valid) in _CONFIG_FIELDS.items()]
    checks += [(f"lifecycle.{key}", lifecycle.get(key) if type(lifecycle) is dict else None,
                "a Unix time in seconds", _is_seconds) for key in schema.LIFECYCLE_EVENTS]
    for name, value, what, valid in checks:
        if value is not None and not valid(value):
            raise RecordingError(f"{file}: {name} is not {what} ({_preview(value)})")
    for fields, where in ((_MANIFEST_FIELDS, manifest), (_CONFIG_FIELDS, config if type(config) is dict else {})):
        for key in fields:
            if key in where and where[key] is None:  # null: as if absent (readers take their default)
                del where[key]
    if "lifecycle" in manifest:  # the events the writer records; nothing else is read
        manifest["lifecycle"] = {k: v for k, v in manifest["lifecycle"].items() if k in schema.LIFECYCLE_EVENTS}
    return manifest


def _preview(value: Any) -> str:
    """A short, one-line description of a JSON value for an error message."""
    if isinstance(value, (dict, list)):
        return f"{'an object' if isinstance(value, dict) else 'a list'} of {len(value)}"
    return repr(value)[:40]
