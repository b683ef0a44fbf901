"""Warnings that a run has stopped learning, from the metrics rows it already writes.

GRPO learns only from prompt groups whose samples disagree. Two ways a run stalls were
measured on the small tasks (bench.seed_robustness): most groups stuck from the start (the
task is too hard for the policy: no sample is ever right), and a collapse, where the
entropy falls to near zero while part of the prompts are still answered wrong, every sample
the same way, so nothing moves them any more. Both show in `stuck_group_frac` and
`entropy` long before the held-out score says so.
"""

from __future__ import annotations

from infra.config import MonitorConfig


class SignalMonitor:
    """Feed it every iteration's metrics row; it returns the warnings that start now."""

    def __init__(self, cfg: MonitorConfig) -> None:
        self.cfg = cfg
        self._no_signal_run = 0
        self._warned: set[str] = set()  # conditions that hold now and were warned of

    def observe(self, row: dict) -> list[str]:
        stuck, entropy = row.get("stuck_group_frac"), row.get("entropy")
        if stuck is None:
            return []
        cfg = self.cfg
        self._no_signal_run = self._no_signal_run + 1 if stuck >= cfg.stuck_group_frac else 0
        holds = {
            "no_signal": self._no_signal_run >= cfg.patience,
            "collapse": entropy is not None
            and entropy < cfg.entropy_floor
            and stuck >= cfg.collapse_stuck_frac,
        }
        started = [name for name, now in holds.items() if now and name not in self._warned]
        self._warned = {name for name, now in holds.items() if now}
        return [self._message(name, stuck, entropy) for name in started]

    def _message(self, name: str, stuck: float, entropy: float | None) -> str:
        if name == "no_signal":
            return (
                f"no learning signal: {stuck:.0%} of the prompt groups are stuck (every sample got the same "
                f"reward, below the best) for {self._no_signal_run} iterations in a row; the task may be too "
                "hard for the policy: more samples per prompt (rollout.n_samples_per_prompt), "
                "rollout.dynamic_sampling, or a supervised warm start (flows.pipeline) help"
            )
        return (
            f"entropy collapse: mean token entropy {entropy:.3f} < monitor.entropy_floor="
            f"{self.cfg.entropy_floor:g} while {stuck:.0%} of the prompt groups are stuck; the policy answers "
            "them the same wrong way every time and GRPO gets no gradient from them (a lower algorithm.lr, "
            "algorithm.eps_clip_high or algorithm.entropy_coef keep it exploring)"
        )
