"""``record()`` of an array that is neither torch's nor NumPy's (JAX, CuPy, TensorFlow: ``item()`` waits on the
device) never reads it on the training thread: the recorder's thread does, and gets the same value."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

import otelprof
from otelprof.recording.reader import read_recording


class DeviceArray:
    """Stands for a JAX array: ``item()`` would block on the device; it notes the thread that calls it."""

    calls: list[int] = []

    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        DeviceArray.calls.append(threading.get_ident())
        return self.value


class Broken:
    def item(self) -> float:
        raise RuntimeError("device lost")


def test_device_arrays_are_read_off_the_training_thread_with_their_values(tmp_path: Path) -> None:
    DeviceArray.calls = []
    session = otelprof.init(job_name="arrays", record_dir=str(tmp_path / "runs"), system_metrics=False,
                            profile_every=0)
    assert isinstance(session, otelprof.Session)
    losses = [0.5, 0.25, 0.125]
    for loss in losses:
        with otelprof.step():
            otelprof.record("loss", DeviceArray(loss))
            otelprof.record("grad_norm", np.float32(2.0))
            otelprof.record("learning_rate", np.array(0.1))
            otelprof.record("my_metric", Broken())  # dropped, counted, no exception here
    training_thread = threading.get_ident()
    assert training_thread not in DeviceArray.calls  # nothing read on the training thread
    assert session.run_dir is not None
    run_dir = session.run_dir.parent
    otelprof.shutdown()  # what the recorder's thread had not read yet is read now (shutdown is not a step)
    assert len(DeviceArray.calls) == len(losses)
    rank = read_recording(run_dir).ranks[0]
    assert [step.scalars.get("loss") for step in rank.steps] == losses
    assert all(step.scalars.get("grad_norm") == 2.0 for step in rank.steps)
    assert all(abs(step.scalars.get("learning_rate", 0) - 0.1) < 1e-9 for step in rank.steps)
    assert all("my_metric" not in step.scalars for step in rank.steps)
