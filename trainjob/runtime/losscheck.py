"""When and how the runtime stops a replica whose training loss became NaN or Inf (exit 6).

Pure (no TensorFlow): the Keras callbacks (:mod:`trainjob.runtime.callbacks`) call it with the
losses they read.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from trainjob.runtime import devices, exitcodes
from trainjob.runtime import settings as settings_mod


class LossCheck(enum.Enum):
    """When the runtime reads the training loss to stop at NaN/Inf."""

    OFF = "off"  # config stop_on_nonfinite_loss: false
    # Every step's loss, as tf.keras' TerminateOnNaN does, but read one step late (see
    # LaggedLossCheck) unless a step event fetches the logs anyway.
    EVERY_STEP = "every-step"
    # ParameterServer and GPUs: only where the logs are fetched anyway (step events, epoch
    # ends); fetching each step would make the coordinator wait for every step it schedules,
    # and on a GPU the host wait for the device.
    FETCHED = "fetched"


def loss_check_for(
    config: Mapping[str, Any], *, parameter_server: bool, on_gpu: bool = False
) -> LossCheck:
    """On a GPU (or ``loss_check: at_reports``) only where the logs are fetched anyway: a host
    read of a device value waits for the whole device queue (see
    :func:`trainjob.runtime.devices.loss_check_mode`)."""
    if not settings_mod.stop_on_nonfinite_loss(config):
        return LossCheck.OFF
    if parameter_server or devices.loss_check_mode(config, on_gpu=on_gpu) == devices.AT_REPORTS:
        return LossCheck.FETCHED
    return LossCheck.EVERY_STEP


def check_logs(logs: Mapping[str, Any], *, step: int, epoch: int) -> None:
    """TerminateOnNaN's test, but failing the replica (exit 6) instead of ending fit as if
    training had succeeded."""
    loss = logs.get("loss")
    if loss is not None:
        exitcodes.check_loss(float(loss), step=step, epoch=epoch)


class LaggedLossCheck:
    """Checks each step's loss when the next step ends.

    Reading a step's loss at once (TerminateOnNaN) makes the host wait for that step on the
    device before it dispatches the next one; read one step later, it is (almost always)
    already computed while the next step runs. A NaN step is still named by its own step
    number; at most one more step runs, on weights that are NaN already.
    """

    def __init__(self) -> None:
        self._pending: tuple[Any, int, int] | None = None

    def push(self, loss: Any, *, step: int, epoch: int) -> None:
        """Check the step before, then keep this one's (a scalar, or None without a loss)."""
        self.flush()
        if loss is not None:
            self._pending = (loss, step, epoch)

    def flush(self) -> None:
        """Check the kept loss now (raises :class:`NonFiniteLossError`)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            loss, step, epoch = pending
            exitcodes.check_loss(float(loss), step=step, epoch=epoch)
