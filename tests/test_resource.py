from __future__ import annotations

import pytest

from otelprof import environment_variables as ev
from otelprof import semconv as sc
from otelprof.config import Config
from otelprof.resource import build_resource, identity_labels


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
