"""When the loop syncs, saves and evaluates: pure functions of the iteration, so the flow
reads like the algorithm and the rules are tested without Prefect or Ray."""

from __future__ import annotations

from dataclasses import dataclass

from infra.config import RunConfig
from infra.data.epochs import batch_ends_epoch


def _every(interval: int | None, k: int) -> bool:
    return bool(interval) and (k + 1) % interval == 0


@dataclass(frozen=True)
class LoopSchedule:
    num_rollout: int
    update_weights_interval: int
    save_interval: int | None
    eval_interval: int | None
    hf_export_interval: int | None
    num_critic_only_steps: int
    batch_size: int  # prompts per rollout
    num_prompts: int  # train prompts per epoch

    @classmethod
    def from_config(cls, cfg: RunConfig, num_prompts: int, start: int = 0) -> LoopSchedule:
        """The schedule of one flow run starting at `start`; it stops early at iterations_per_run.

        `num_prompts` is the number of train rows (preflight loads them): epoch ends are then
        known here, without asking the rollout manager every iteration."""
        if num_prompts < 1:
            raise ValueError(f"data.train_path: no train prompts (got {num_prompts} rows)")
        stop = cfg.num_rollout
        if cfg.iterations_per_run:
            stop = min(stop, start + cfg.iterations_per_run)
        return cls(
            num_rollout=stop,
            update_weights_interval=cfg.update_weights_interval,
            save_interval=cfg.checkpoint.save_interval,
            eval_interval=cfg.eval.interval,
            hf_export_interval=cfg.checkpoint.hf_export_interval,
            num_critic_only_steps=cfg.num_critic_only_steps,
            batch_size=cfg.rollout.prompts_drawn,
            num_prompts=num_prompts,
        )

    def ends_epoch(self, k: int) -> bool:
        return batch_ends_epoch(k, self.batch_size, self.num_prompts)

    def is_last(self, k: int) -> bool:
        return k == self.num_rollout - 1

    def has_next(self, k: int) -> bool:
        return k + 1 < self.num_rollout

    def actor_trains(self, k: int) -> bool:
        return k >= self.num_critic_only_steps

    def sync_after(self, k: int) -> bool:
        # The last iteration syncs too, so a final eval and the engines see the final weights.
        return _every(self.update_weights_interval, k) or self.is_last(k)

    def save_after(self, k: int) -> bool:
        return _every(self.save_interval, k) or self.ends_epoch(k) or self.is_last(k)

    def export_hf_after(self, k: int) -> bool:
        return _every(self.hf_export_interval, k) or self.is_last(k)

    def train_ahead(self, k: int) -> bool:
        """May training of k+1 be submitted during iteration k, to start as soon as k's
        weight sync (or, between syncs, k's training) is done? Not across a save: the
        checkpoint of k must hold the weights before k+1's step."""
        return self.has_next(k) and not self.save_after(k)

    def generate_behind_sync(self, k: int, rollout_id: int) -> bool:
        """May the generate of `rollout_id` be submitted during iteration k, to start as k's
        weight sync ends? Not across a save (its checkpoint holds the prompt state and the
        batch generated ahead as they are before the next generate) nor an eval (which the flow submits once the sync has returned;
        sampling beside it would share the engines with it and lengthen its time)."""
        return (
            self.sync_after(k)
            and rollout_id < self.num_rollout
            and not self.save_after(k)
            and not self.eval_after(k)
        )

    def eval_after(self, k: int) -> bool:
        return bool(self.eval_interval) and (_every(self.eval_interval, k) or self.ends_epoch(k))
