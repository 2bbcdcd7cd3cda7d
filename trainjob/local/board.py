"""`trainjob tensorboard` for a local run, the pure part: which directory TensorBoard serves,
its command line, and the URL it announces.

TensorBoard serves the run's whole checkpoint directory (the runtime's TRAINJOB_CHECKPOINT_DIR,
as a Pod mounts its volume): Keras' logs (tensorboard/train, tensorboard/validation), the
runtime's progress scalars (tensorboard/progress), an Estimator's model_dir (estimator/) and any
event files a command of one's own writes there are all found, each as a run of its own.
"""

from __future__ import annotations

import os.path
import re
from collections.abc import Sequence
from typing import Final

from trainjob.local import plan

# TensorBoard's own announcement on stderr: "TensorBoard 2.21.0 at http://127.0.0.1:6006/ ..."
_ANNOUNCED: Final = re.compile(r"TensorBoard \S+ at (http://\S+/)")
TENSORBOARD_LOG: Final = "tensorboard.log"


def logdir(run_dir: str) -> str:
    return os.path.join(run_dir, plan.CHECKPOINTS_DIR)


def argv(python: str, directory: str, address: str, port: int | None) -> list[str]:
    """TensorBoard in the Python that runs trainjob. Port None: TensorBoard's own choice
    (6006, else the next free one); 0: any free port."""
    return [
        python, "-m", "tensorboard.main", "--logdir", directory, "--host", address,
        "--port", "default" if port is None else str(port),
    ]  # fmt: skip


def announced_url(text: str) -> str | None:
    """The URL TensorBoard says it serves at, once it has said so."""
    found = _ANNOUNCED.search(text)
    return found.group(1) if found else None


def last_words(text: str, lines: int = 3) -> str:
    """The end of TensorBoard's output, to say why it exited (its error is its last line)."""
    kept: Sequence[str] = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[-lines:]) or "no output"
