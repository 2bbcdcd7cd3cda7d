"""Helpers the samples share."""

from __future__ import annotations

import time
from typing import Any


def input_delay(tf: Any, dataset: Any, delay_ms: int) -> Any:
    """Pause ``delay_ms`` per element: slows the input, not the model, so that a test can catch
    training mid-epoch on a fast machine. A no-op for 0."""
    if delay_ms <= 0:
        return dataset

    def _pause(value: Any) -> Any:
        time.sleep(delay_ms / 1000.0)
        return value

    def _delayed(x: Any, y: Any) -> tuple[Any, Any]:
        label = tf.numpy_function(_pause, [y], y.dtype)
        label.set_shape(y.shape)
        return x, label

    return dataset.map(_delayed)
