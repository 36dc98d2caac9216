from __future__ import annotations

from pathlib import Path

import pytest

from otelprof import environment_variables as ev
from otelprof import semconv as sc
from otelprof.config import Config
from otelprof.runtime.resource import build_resource, identity_labels


def test_kubernetes_and_torchrun_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        ev.OTELPROF_JOB_NAME: "bert", ev.RANK: "3", ev.LOCAL_RANK: "1", ev.WORLD_SIZE: "4",
        ev.TORCHELASTIC_RUN_ID: "run-7", ev.KUBERNETES_SERVICE_HOST: "10.0.0.1",
        ev.OTELPROF_POD_NAME: "bert-worker-1", ev.OTELPROF_POD_NAMESPACE: "ml",
        ev.OTELPROF_NODE_NAME: "gpu-node-4", ev.OTELPROF_CONTAINER_NAME: "trainer",
    }
    resource = build_resource(Config.from_env(env))
    attrs = resource.attributes
    assert attrs[sc.SERVICE_NAME] == "bert"
    assert attrs[sc.OTELPROF_RUN_ID] == "run-7"
    assert (attrs[sc.OTELPROF_RANK], attrs[sc.OTELPROF_LOCAL_RANK], attrs[sc.OTELPROF_WORLD_SIZE]) == (3, 1, 4)
    assert attrs[sc.K8S_POD_NAME] == "bert-worker-1"
    assert attrs[sc.K8S_NAMESPACE_NAME] == "ml"
    assert attrs[sc.K8S_NODE_NAME] == "gpu-node-4"
    assert attrs[sc.K8S_CONTAINER_NAME] == "trainer"
    assert attrs[sc.SERVICE_INSTANCE_ID] == "run-7-rank3"
    assert sc.HOST_NAME in attrs and sc.PROCESS_PID in attrs
    assert identity_labels(resource) == {"job_name": "bert", "rank": "3", "local_rank": "1", "node": "gpu-node-4"}


def test_otel_resource_attributes_win_over_detected_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ev.OTEL_RESOURCE_ATTRIBUTES, "k8s.pod.name=from-env,team=vision")
    resource = build_resource(Config.from_env({ev.OTELPROF_POD_NAME: "detected"}))
    assert resource.attributes[sc.K8S_POD_NAME] == "from-env"
    assert resource.attributes["team"] == "vision"


def test_node_label_falls_back_to_host_name() -> None:
    resource = build_resource(Config.from_env({}))
    assert identity_labels(resource)["node"] == resource.attributes[sc.HOST_NAME]
    assert sc.K8S_POD_NAME not in resource.attributes


def test_pod_uid_job_name_service_namespace_and_schema_url() -> None:
    """The downward-API attributes the pod template sets, service.namespace from the pod's namespace, and the
    semantic-conventions schema on the Resource; OTEL_RESOURCE_ATTRIBUTES still wins."""
    env = {ev.KUBERNETES_SERVICE_HOST: "10.0.0.1", ev.OTELPROF_POD_NAME: "bert-worker-1",
           ev.OTELPROF_POD_NAMESPACE: "ml", ev.OTELPROF_POD_UID: "6f1c2e1a-8c3e-4d2b-9b1f-0a1b2c3d4e5f",
           ev.OTELPROF_K8S_JOB_NAME: "bert-pretrain"}
    resource = build_resource(Config.from_env(env))
    attrs = resource.attributes
    assert attrs[sc.K8S_POD_UID] == "6f1c2e1a-8c3e-4d2b-9b1f-0a1b2c3d4e5f"
    assert attrs[sc.K8S_JOB_NAME] == "bert-pretrain"
    assert attrs[sc.SERVICE_NAMESPACE] == "ml"
    assert resource.schema_url == sc.SCHEMA_URL
    outside = build_resource(Config.from_env({}))
    assert not {sc.K8S_POD_UID, sc.K8S_JOB_NAME, sc.SERVICE_NAMESPACE} & set(outside.attributes)
    assert outside.schema_url == sc.SCHEMA_URL


def test_otel_resource_attributes_win_over_service_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ev.OTEL_RESOURCE_ATTRIBUTES, "service.namespace=research")
    resource = build_resource(Config.from_env({ev.OTELPROF_POD_NAMESPACE: "ml"}))
    assert resource.attributes[sc.SERVICE_NAMESPACE] == "research" and resource.schema_url == sc.SCHEMA_URL


def test_metrics_and_spans_carry_the_schema_url(tmp_path: Path) -> None:
    import otelprof

    session = otelprof.init(job_name="schema", record_dir=str(tmp_path), metrics_exporters=(), traces_exporter="none")
    try:
        data = session.metrics_data()
        (resource_metrics,) = data.resource_metrics
        assert resource_metrics.schema_url == sc.SCHEMA_URL
        assert {s.scope.schema_url for s in resource_metrics.scope_metrics} == {sc.SCHEMA_URL}
        assert {s.schema_url for s in resource_metrics.scope_metrics} == {sc.SCHEMA_URL}
    finally:
        otelprof.shutdown()
