from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from otelprof import environment_variables as ev
from otelprof import semconv as sc
from otelprof.cli import main


def test_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("env", "catalog", "demo", "generate"):
        assert command in out


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage" in capsys.readouterr().out


def test_env_prints_every_variable_with_current_value(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ev.OTELPROF_SPAN_BUDGET, "0.02")
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    for var in ev.ENV_VARS:
        assert var.name in out
    assert "= 0.02" in out


def test_invalid_configuration_exits_2_with_a_clear_message(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ev.OTEL_EXPORTER_OTLP_PROTOCOL, "carrier-pigeon")
    assert main(["env"]) == 2
    assert "OTEL_EXPORTER_OTLP_PROTOCOL" in capsys.readouterr().err


def test_bad_arguments_exit_2() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--duration", "-1"])
    assert exit_info.value.code == 2


def test_demo_records_a_run_and_prints_where(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "otelprof", "demo", "--duration", "3", "--record-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    [run_dir] = list(tmp_path.iterdir())
    assert str(run_dir) in result.stdout
    assert "train:" in result.stdout
    from otelprof.recording.reader import read_recording

    rank = read_recording(run_dir).ranks[0]
    assert len(rank.steps) > 10
    assert {sc.REGION_DATALOADER, "forward", "backward", "optimizer"} <= {a.name for a in rank.steps[0].annotations}
    assert {a.name for a in rank.annotations} >= {"initialization", "checkpoint"}
    assert rank.manifest["status"] == "finished"


def test_what_a_control_endpoint_answers_is_printed_escaped(tmp_path: Path) -> None:
    """``otelprof capture`` prints the endpoint's answer: a hostile one can neither forge lines nor drive the
    terminal."""
    import http.server
    import threading

    hostile = b'{"armed": true, "note": "\x1b[2J\x1b]0;pwned\x07"}\notelprof capture: forged\n'

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200 if self.path == "/v1/capture" else 500)
            self.send_header("Content-Length", str(len(hostile)))
            self.end_headers()
            self.wfile.write(hostile)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        proc = subprocess.run([sys.executable, "-m", "otelprof", "capture", f"127.0.0.1:{server.server_port}"],
                              capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert proc.stdout.startswith('{"armed": true, "note": "\\x1b[2J\\x1b]0;pwned\\x07"}\\notelprof capture: forged')


def test_env_names_a_misspelt_variable(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTELPROF_SPAN_BUGDET", "0.5")
    assert main(["env"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "OTELPROF_SPAN_BUGDET  is not an otelprof setting: ignored (did you mean OTELPROF_SPAN_BUDGET?)")
