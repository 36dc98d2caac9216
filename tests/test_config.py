from __future__ import annotations

import logging

import pytest

from otelprof import environment_variables as ev
from otelprof.config import Config, ConfigError


def test_defaults_without_environment() -> None:
    config = Config.from_env({})
    assert config.record is True
    assert config.traces_exporters == ()
    assert config.metrics_exporters == ()
    assert config.prometheus_host == "127.0.0.1"
    assert config.prometheus_rank_port == 9464
    assert config.span_budget == 0.001
    assert config.shutdown_timeout == 3.0


def test_explicit_argument_beats_env_beats_default() -> None:
    env = {ev.OTELPROF_SPAN_BUDGET: "0.01", ev.OTELPROF_SPAN_FIRST_STEPS: "3"}
    config = Config.from_env(env, span_budget=0.02)
    assert config.span_budget == 0.02
    assert config.span_first_steps == 3
    assert Config.from_env({}).span_first_steps == 10


def test_kubernetes_defaults_bind_all_interfaces_and_serve_prometheus() -> None:
    config = Config.from_env({ev.KUBERNETES_SERVICE_HOST: "10.0.0.1", "HOSTNAME": "trainer-0"})
    assert config.prometheus_host == "0.0.0.0"
    assert config.metrics_exporters == ("prometheus",)
    assert config.pod_name == "trainer-0"


def test_otlp_endpoint_turns_otlp_on_unless_exporter_is_given() -> None:
    env = {ev.OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318"}
    assert Config.from_env(env).traces_exporters == ("otlp",)
    assert Config.from_env(env).metrics_exporters == ("otlp",)
    env[ev.OTEL_TRACES_EXPORTER] = "none"
    assert Config.from_env(env).traces_exporters == ()


def test_torchrun_variables_and_per_rank_port() -> None:
    env = {ev.RANK: "5", ev.LOCAL_RANK: "1", ev.WORLD_SIZE: "8", ev.TORCHELASTIC_RUN_ID: "abc",
           ev.OTEL_EXPORTER_PROMETHEUS_PORT: "9500"}
    config = Config.from_env(env)
    assert (config.rank, config.local_rank, config.world_size) == (5, 1, 8)
    assert config.run_id == "abc"
    assert config.prometheus_rank_port == 9501


def test_job_name_precedence() -> None:
    assert Config.from_env({ev.OTEL_SERVICE_NAME: "svc"}).job_name == "svc"
    assert Config.from_env({ev.OTEL_SERVICE_NAME: "svc", ev.OTELPROF_JOB_NAME: "job"}).job_name == "job"


def test_span_windows_parse() -> None:
    config = Config.from_env({ev.OTELPROF_SPAN_WINDOWS: "100:20, 500:5"})
    assert config.span_windows == ((100, 20), (500, 5))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (ev.OTELPROF_SPAN_BUDGET, "abc"),
        (ev.OTELPROF_SPAN_BUDGET, "2"),
        (ev.OTEL_TRACES_EXPORTER, "zipkin"),
        (ev.OTEL_EXPORTER_OTLP_PROTOCOL, "http/json"),
        (ev.OTELPROF_SPAN_WINDOWS, "10"),
        (ev.OTELPROF_RECORD, "maybe"),
        (ev.OTEL_METRIC_EXPORT_INTERVAL, "5"),
    ],
)
def test_invalid_values_warn_and_fall_back_in_library_but_fail_in_strict_mode(
    name: str, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    from otelprof._log import reset_warnings

    reset_warnings()
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        config = Config.from_env({name: value})
    assert name in caplog.text
    default = Config.from_env({})
    assert config == default
    with pytest.raises(ConfigError, match=name):
        Config.from_env({name: value}, strict=True)


def test_unknown_override_is_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    from otelprof._log import reset_warnings

    reset_warnings()
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        config = Config.from_env({}, no_such_setting=1, span_budget="bad")
    assert "no_such_setting" in caplog.text
    assert "span_budget" in caplog.text
    assert config.span_budget == 0.001


def test_every_config_field_is_documented() -> None:
    documented = {v.field for v in ev.ENV_VARS if v.field}
    from dataclasses import fields

    assert {f.name for f in fields(Config)} == documented


def test_a_rank_port_past_65535_turns_that_endpoint_off(caplog: pytest.LogCaptureFixture) -> None:
    env = {ev.OTEL_EXPORTER_PROMETHEUS_PORT: "65535", ev.OTELPROF_CONTROL_PORT: "65000", ev.LOCAL_RANK: "1",
           ev.OTEL_METRICS_EXPORTER: "prometheus,otlp"}
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        config = Config.from_env(env)
    assert (config.prometheus_port, config.metrics_exporters) == (0, ("otlp",))  # no /metrics at all
    assert config.control_rank_port == 65001
    assert [r.getMessage() for r in caplog.records] == [
        "otelprof: OTEL_EXPORTER_PROMETHEUS_PORT=65535 + local rank 1 is port 65536, above 65535; /metrics is not "
        "served by this process (lower OTEL_EXPORTER_PROMETHEUS_PORT)"]
    assert Config.from_env({ev.OTELPROF_CONTROL_PORT: "65535"}, local_rank=3).control_port == 0  # an argument too
    with pytest.raises(ConfigError, match="port 65536"):
        Config.from_env(env, strict=True)


def test_text_settings_are_made_encodable() -> None:
    config = Config.from_env({ev.OTELPROF_JOB_NAME: "caf\udce9", ev.OTELPROF_NODE_NAME: "n\udcff"},
                             pod_name="p\ud800", record_dir="runs-\udce9")
    assert (config.job_name, config.node_name, config.pod_name) == ("caf?", "n?", "p?")
    assert config.record_dir == "runs-\udce9"  # a path: the file system takes it as it is
    assert config.as_dict()["record_dir"] == "runs-?"  # the manifest is strict JSON


def test_unknown_otelprof_variables_and_their_closest_setting() -> None:
    from otelprof.config import unknown_variables

    env = {"OTELPROF_PROFIL_EVERY": "0", "OTELPROF_RUN": "1", ev.OTELPROF_QUIET: "1", "OTEL_FOO": "x"}
    assert unknown_variables(env) == ["OTELPROF_PROFIL_EVERY"]
    assert ev.closest("OTELPROF_PROFIL_EVERY") == ev.OTELPROF_PROFILE_EVERY
    assert ev.closest("OTELPROF_RECORDDIR") == ev.OTELPROF_RECORD_DIR
    assert ev.closest("OTELPROF_ZZZ") is None
