"""A credential in OTELPROF_RECORD_DIR's URL (`s3://user:SECRET@bucket/prefix`) is never printed, logged or
saved: not on the job's stderr, not in manifest.json or the spool's .destination.json, not in `otelprof env`.
A real `otelprof run` of a torch loop against a real S3-compatible server on 127.0.0.1."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from otelprof._log import escape, redact, sanitize
from otelprof.recording import spool
from tests.test_object_storage import S3, TORCH_LOOP, _env, _otelprof
from tests.test_object_storage import s3 as s3  # the fixture, used by name

SECRET = "Sup3rS3cretPassw0rd"


def test_redact_replaces_user_info_of_every_url() -> None:
    text = f"to s3://me:{SECRET}@bucket/x and gs://{SECRET}@b/y, not a@b.c"
    assert SECRET not in redact(text) and "s3://***@bucket/x" in redact(text) and "a@b.c" in redact(text)
    assert SECRET not in sanitize(text) and SECRET not in escape(text)


def test_a_password_in_the_record_url_is_never_shown_or_saved(s3: S3, tmp_path: Path) -> None:
    s3.client().create_bucket(Bucket="runs")
    script, mine = tmp_path / "loop.py", tmp_path / "loop.json"
    script.write_text(TORCH_LOOP)
    spool_dir = tmp_path / "spool"
    url = f"s3://user:{SECRET}@runs/team"
    env = _env(s3, OTELPROF_RECORD_DIR=url, OTELPROF_RECORD_SPOOL_DIR=str(spool_dir),
               OTELPROF_RECORD_UPLOAD_INTERVAL="0.2", OTELPROF_RUN_ID="secret-run", OTELPROF_SYSTEM_METRICS="false")
    job = _otelprof("run", "--", sys.executable, str(script), str(mine), env=env, cwd=tmp_path)
    assert job.returncode == 0, job.stderr
    assert mine.exists()  # the job ran
    assert SECRET not in job.stderr + job.stdout and "***@" in job.stderr, job.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "loop.py"]
    assert written
    for path in written:
        assert SECRET.encode() not in path.read_bytes(), path
    shown = _otelprof("env", env=env, cwd=tmp_path)
    assert SECRET not in shown.stdout + shown.stderr


def test_the_destination_file_holds_no_credential(tmp_path: Path) -> None:
    spool.record_destination(tmp_path, f"s3://key:{SECRET}@bucket/p")
    saved = json.loads((tmp_path / spool.DESTINATION).read_text())
    assert saved == {"url": "s3://***@bucket/p"}
