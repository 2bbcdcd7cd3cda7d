"""Where the runtime writes under the shared checkpoint directory (pure path arithmetic).

::

    <TRAINJOB_CHECKPOINT_DIR>/
      backup/          Keras BackupAndRestore state (chief writes; other workers use temp dirs
                       inside it that tf-keras removes); deleted when training completes
      loop/            a custom loop's tf.train.Checkpoint files (ckpt-<step>), chief's copy only
      export/          the final model, written by the chief only
      tensorboard/     TensorBoard logs (chief only)
      estimator/       Estimator model_dir (checkpoints, events, export/)
      .tmp-<replica>/  scratch for non-chief replicas (e.g. their throw-away export); removed
"""

from __future__ import annotations

import os

BACKUP: str = "backup"
EXPORT: str = "export"
TENSORBOARD: str = "tensorboard"
ESTIMATOR: str = "estimator"
LOOP: str = "loop"


def backup_dir(checkpoint_dir: str) -> str:
    return os.path.join(checkpoint_dir, BACKUP)


def tensorboard_dir(checkpoint_dir: str) -> str:
    return os.path.join(checkpoint_dir, TENSORBOARD)


def estimator_dir(checkpoint_dir: str) -> str:
    return os.path.join(checkpoint_dir, ESTIMATOR)


def loop_dir(checkpoint_dir: str, *, is_chief: bool = True, replica: str = "") -> str:
    """Where a custom loop's CheckpointManager writes: the chief into ``loop/``, every other
    worker into its scratch dir (MultiWorkerMirrored needs all workers in a save, TF's
    multi-worker guide keeps only the chief's copy)."""
    base = checkpoint_dir if is_chief else scratch_dir(checkpoint_dir, replica)
    return os.path.join(base, LOOP)


def scratch_dir(checkpoint_dir: str, replica: str) -> str:
    return os.path.join(checkpoint_dir, f".tmp-{replica}")


def export_path(checkpoint_dir: str, *, is_chief: bool, replica: str, export_format: str) -> str:
    """The chief exports to ``export/``; every other replica to its scratch dir.

    All-reduce strategies need every worker to take part in saving (reading distributed
    variables may run collectives), so the others save too, somewhere thrown away.
    """
    base = (
        os.path.join(checkpoint_dir, EXPORT)
        if is_chief
        else os.path.join(scratch_dir(checkpoint_dir, replica), EXPORT)
    )
    return os.path.join(base, "model.keras") if export_format == "keras" else base
