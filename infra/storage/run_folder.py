"""What a new run may do with a run folder that already holds outputs.

Two runs must never mix in one folder (metrics rows appended to another run's, or a save
that takes another run's checkpoint for its own). `checkpoint.resume` says what to do:

- `never`: refuse, before anything starts, naming the folder and the ways out;
- `fresh`: delete the folder's contents, then start at iteration 0;
- `auto` or a checkpoint URI: continue that run (metrics after the checkpoint are dropped).

`sft/` holds a pipeline's SFT stage (infra/sft_stage.py): the model RL starts from, not an
output of RL, so `fresh` keeps it.
"""

from __future__ import annotations

from infra.config import RunConfig
from infra.storage.checkpoints import CheckpointStore, config_hash, read_committed_meta
from infra.storage.fs import RunStore

# Entries a run writes as it trains; `base_model/` and `prefect-results/` alone are not
# outputs (a failed start may leave them) but `fresh` removes them too.
OUTPUTS = ("metrics.jsonl", "rollouts", "checkpoints", "hf", "weights")
SFT_DIR = "sft"


class RunFolderInUse(ValueError):
    """`checkpoint.resume=never` on a run folder that holds another run's outputs."""


def existing_outputs(store: RunStore) -> list[str]:
    return [name for name in OUTPUTS if store.exists(name)]


def refuse_if_used(cfg: RunConfig, store: RunStore) -> None:
    found = existing_outputs(store)
    if cfg.checkpoint.resume == "never" and found:
        raise RunFolderInUse(
            f"checkpoint.resume=never: the run folder {store.run_uri} already holds outputs of an "
            f"earlier run ({', '.join(found)}). Continue it with checkpoint.resume=auto, delete them "
            f"and start over with checkpoint.resume=fresh, or choose another run_name."
        )


def clear_for_fresh_start(store: RunStore) -> list[str]:
    """Delete everything under the run folder but the SFT stage's `sft/` (for
    `resume=fresh`); returns what was deleted."""
    names = [name for name in store.ls() if name != SFT_DIR]
    for name in names:
        store.delete(name, recursive=True)
    return names


def resume_point(cfg: RunConfig, store: RunStore) -> tuple[str, dict] | None:
    """The checkpoint a resume would load and its meta, or None (start at 0). Refuses a
    checkpoint written with another model/data/rollout/algorithm config."""
    spec = cfg.checkpoint.resume
    if spec in ("never", "fresh"):
        return None
    if spec == "auto":
        ckpts = CheckpointStore(store, keep_last=None)
        latest = ckpts.latest()
        if latest is None:
            return None
        uri = ckpts.uri(latest)
    else:
        uri = spec.rstrip("/")
    meta = read_committed_meta(uri, store.options)
    if meta.get("config_hash") != config_hash(cfg):
        raise ValueError(
            f"checkpoint.resume: {uri} was written by a run with another model/data/rollout/algorithm "
            "config; start a new run_name or resume=fresh"
        )
    return uri, meta


def finished_message(cfg: RunConfig, point: tuple[str, dict] | None) -> str | None:
    """Why there is nothing to do (the checkpoint already holds all num_rollout iterations)."""
    if point is None:
        return None
    uri, meta = point
    done = meta["next_rollout_id"]
    if done < cfg.num_rollout:
        return None
    return (
        f"run {cfg.run_name} is already finished: {uri} holds {done} of num_rollout={cfg.num_rollout} "
        "iterations; nothing to do (raise num_rollout to train on, or resume=fresh to start over)"
    )
