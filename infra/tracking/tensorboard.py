"""TensorBoard event files under the run's storage (`<run>/tensorboard/`).

The writer needs a local folder; for an S3 run the events are written to a temporary
folder and the event file is uploaded after every row, so the bucket always holds a
readable file (TensorBoard reads `s3://` logdirs with its own S3 support).
"""

from __future__ import annotations

import os
import tempfile

from infra.storage.fs import RunStore

FOLDER = "tensorboard"


class TensorBoardTracker:
    def __init__(self, store: RunStore) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.store = store
        self._staging = None if store.is_local else tempfile.TemporaryDirectory(prefix="prl-tb-")
        logdir = store.path(FOLDER) if store.is_local else self._staging.name
        self.writer = SummaryWriter(log_dir=logdir)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()
        self._upload()

    def _upload(self) -> None:
        if self._staging is None:
            return
        for name in os.listdir(self._staging.name):
            with open(os.path.join(self._staging.name, name), "rb") as f:
                self.store.write_bytes(f"{FOLDER}/{name}", f.read())

    def close(self) -> None:
        self.writer.close()
        self._upload()
        if self._staging is not None:
            self._staging.cleanup()
