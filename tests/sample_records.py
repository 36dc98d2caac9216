"""samples.jsonl's sample records, block lines (schema 1.2) expanded to their samples."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otelprof.recording.sample_blocks import KIND, decode


def sample_records(path: Path) -> list[dict[str, Any]]:
    """Every sample of a samples.jsonl, in file order."""
    out: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        out += decode(record) if record.get("k") == KIND else [record]
    return out
