"""Checkpoint folders with a commit protocol, on any fsspec storage.

`<run>/checkpoints/iter_<rollout_id:07d>/` holds `model/` (torch.distributed.checkpoint
shards of model, optimizer, scheduler and RNG states; with a PPO critic also `critic/`,
the same for the critic), `meta.json`, and `COMMITTED`,
written last. `latest` is rewritten only after the marker, so a reader never follows it
to a partial checkpoint; folders without a marker are never loaded and are removed by the
next save.

A checkpoint written in the background is pending: its folder holds `meta.json` (naming the
flow run that writes it) but no marker while the trainer ranks' threads write the shards.
`commit_written` writes the marker only once every rank of every trainer group reported its
write of that folder durable; a run that dies before that leaves a folder that is ignored
and cleaned like any partial one, and a resume takes the previous committed checkpoint.
"""

from __future__ import annotations

import hashlib
import json

from infra.config import RESOLVED_SEEDS, RunConfig
from infra.storage.fs import RunStore, read_uri, uri_exists

MARKER = "COMMITTED"
# Sections that define what is being trained; changing them makes a checkpoint foreign.
_IDENTITY_SECTIONS = ("model", "data", "rollout", "algorithm", "critic")


def config_hash(cfg: RunConfig) -> str:
    identity = cfg.model_dump(mode="json", include=set(_IDENTITY_SECTIONS), context=RESOLVED_SEEDS)
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def iter_name(rollout_id: int) -> str:
    return f"iter_{rollout_id:07d}"


class CheckpointStore:
    def __init__(self, store: RunStore, keep_last: int | None):
        self.store = store
        self.keep_last = keep_last

    def _rel(self, rollout_id: int, *parts: str) -> str:
        return "/".join(["checkpoints", iter_name(rollout_id), *parts])

    def uri(self, rollout_id: int) -> str:
        return self.store.uri(self._rel(rollout_id))

    def model_uri(self, ckpt_uri: str) -> str:
        return f"{ckpt_uri.rstrip('/')}/model"

    def is_committed(self, rollout_id: int) -> bool:
        return self.store.exists(self._rel(rollout_id, MARKER))

    def _iterations(self) -> list[int]:
        if not self.store.exists("checkpoints"):
            return []
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.store.ls("checkpoints")]
        return sorted(int(n[5:]) for n in names if n.startswith("iter_") and n[5:].isdigit())

    def committed(self) -> list[int]:
        return [k for k in self._iterations() if self.is_committed(k)]

    def begin(self, rollout_id: int) -> str:
        """Remove leftovers of interrupted saves, then hand out the folder for this one."""
        for k in self._iterations():
            if not self.is_committed(k):
                self.store.delete(self._rel(k), recursive=True)
        return self.uri(rollout_id)

    def mark_pending(self, rollout_id: int, meta: dict) -> None:
        """The meta of a save in progress; without the marker it names the flow run writing it."""
        self.store.write_text(self._rel(rollout_id, "meta.json"), json.dumps(meta, indent=2, sort_keys=True))

    def pending(self, run_id: str) -> list[int]:
        """Uncommitted checkpoints that flow run `run_id` started (its background saves)."""
        found = []
        for k in self._iterations():
            if self.is_committed(k) or not self.store.exists(self._rel(k, "meta.json")):
                continue
            if self.meta(k).get("run_id") == run_id:
                found.append(k)
        return found

    def commit_written(self, run_id: str, written: list[str | None]) -> int | None:
        """Commit run `run_id`'s pending checkpoint if every rank reported it written.

        `written` holds, per rank of every trainer group, the folder its last background
        write went to once durable (None: no such write). Returns the committed iteration."""
        if not written or None in written:
            return None  # nothing written, or not by every rank: nothing may be committed
        for k in self.pending(run_id):
            folder = self.uri(k) + "/"
            if all(path.startswith(folder) for path in written):
                self.commit(k, self.meta(k))
                return k
        return None

    def discard(self, rollout_id: int) -> None:
        """Remove a checkpoint (marker first, so it is never seen half-deleted as whole)."""
        self.store.delete(self._rel(rollout_id, MARKER))
        self.store.delete(self._rel(rollout_id), recursive=True)

    def commit(self, rollout_id: int, meta: dict) -> str:
        self.store.write_text(self._rel(rollout_id, "meta.json"), json.dumps(meta, indent=2, sort_keys=True))
        self.store.write_text(self._rel(rollout_id, MARKER), "")
        self.store.write_text("checkpoints/latest", iter_name(rollout_id))
        if self.keep_last:
            for k in self.committed()[: -self.keep_last]:
                if k != rollout_id:
                    self.store.delete(self._rel(k), recursive=True)
        return self.uri(rollout_id)

    def latest(self) -> int | None:
        """The newest committed iteration; the pointer is a hint, the markers decide."""
        done = self.committed()
        return done[-1] if done else None

    def meta(self, rollout_id: int) -> dict:
        return json.loads(self.store.read_text(self._rel(rollout_id, "meta.json")))


def read_committed_meta(uri: str, storage_options: dict) -> dict:
    """meta.json of the checkpoint at `uri`, refusing folders without the commit marker."""
    uri = uri.rstrip("/")
    if not uri_exists(f"{uri}/{MARKER}", storage_options):
        raise FileNotFoundError(f"checkpoint.resume: {uri} is not a complete checkpoint (no {MARKER} marker)")
    return json.loads(read_uri(f"{uri}/meta.json", storage_options))
