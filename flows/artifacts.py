"""What a run shows in the Prefect UI besides its task runs: artifacts.

- `<run>-progress`: a progress bar, updated as iterations end (at most once a second, and
  at the last one);
- `<run>-eval`: a markdown summary of each evaluation, with a few sample completions;
- `<run>-metrics`: a table with one row per iteration (the whole metrics.jsonl, so a
  resumed run's table continues the earlier runs'); the key keeps every run's version;
- `<run>-reward-curve`: a link to a reward-curve PNG written next to the metrics;
- `<run>-learning-warnings`: a markdown list of the stalled-learning warnings
  (infra/tracking/signal_monitor.py), each also a WARNING line of the flow run's log;
- `<run>-checkpoint`, `<run>-hf-export`, `<run>-rollouts`: links to the outputs.

Keys are per run name, so the artifact history of a key is the history of one training.
"""

from __future__ import annotations

import io
import math
import re
import time

from prefect import get_run_logger
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from infra.config import RunConfig
from infra.storage.fs import RunStore, is_local
from infra.storage.metrics import read_metrics
from infra.tracking.signal_monitor import SignalMonitor

CURVE_FILE = "reward_curve.png"
# Each progress update is an API call in the loop's thread and a write on the server; a bar
# that moves once a second reads the same in the UI as one that moves every iteration.
PROGRESS_EVERY_S = 1.0
# The table's columns, in order (a row lacks those its iteration did not produce).
TABLE_COLUMNS = [
    "rollout_id",
    "reward_mean",
    "eval_reward_mean",
    "loss",
    "grad_norm",
    "kl",
    "pg_clipfrac",
    "weight_version",
    "time_generate_s",
    "time_train_s",
    "time_sync_s",
    "time_iteration_s",
]


def artifact_key(run_name: str, what: str) -> str:
    """Prefect keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{run_name}-{what}".lower()).strip("-")


def link_of(uri: str) -> str:
    """A clickable link: file:// for a local path, the URI itself otherwise."""
    return f"file://{uri.removeprefix('file://')}" if is_local(uri) else uri


def _cell(value: object) -> object:
    if isinstance(value, float):
        return None if not math.isfinite(value) else round(value, 4)
    return value


def metrics_table(rows: list[dict]) -> list[dict]:
    return [{c: _cell(r.get(c)) for c in TABLE_COLUMNS} for r in rows]


def reward_curve_png(rows: list[dict], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")  # no display on workers and CI
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.5), dpi=100)
    ax = fig.add_subplot()
    xs = [r["rollout_id"] for r in rows if r.get("reward_mean") is not None]
    ax.plot(xs, [r["reward_mean"] for r in rows if r.get("reward_mean") is not None], label="train reward")
    evals = [r for r in rows if r.get("eval_reward_mean") is not None]
    if evals:
        ax.plot(
            [r["rollout_id"] for r in evals],
            [r["eval_reward_mean"] for r in evals],
            "o--",
            label="eval reward",
        )
    ax.set_xlabel("iteration")
    ax.set_ylabel("mean reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def eval_markdown(run_name: str, rollout_id: int, result: dict) -> str:
    lines = [
        f"# Evaluation of `{run_name}` after iteration {rollout_id}",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    for key, value in result.items():
        if key != "examples" and isinstance(value, int | float):
            lines.append(f"| {key} | {value:.4g} |")
    examples = result.get("examples") or []
    if examples:
        lines += [
            "",
            "## Sample completions",
            "",
            "| prompt | response | label | reward |",
            "|---|---|---|---|",
        ]
        for ex in examples:
            cells = [_md(ex.get("prompt")), _md(ex.get("response")), _md(ex.get("label"))]
            lines.append(f"| {' | '.join(cells)} | {ex.get('reward', 0.0):.2f} |")
    return "\n".join(lines) + "\n"


def _md(text: object) -> str:
    s = str(text if text is not None else "").replace("|", "\\|").replace("\n", "\\n")
    return f"`{s}`" if s else "(empty)"


class RunArtifacts:
    """Creates a run's artifacts from inside its flow run (the flow body calls it)."""

    def __init__(self, cfg: RunConfig, start: int, stop: int | None = None) -> None:
        """This flow run trains iterations start..stop-1 (stop: num_rollout by default)."""
        self.cfg = cfg
        self.start, self.stop = start, cfg.num_rollout if stop is None else stop
        self.hf_export_uri = ""
        self._progress_at = time.monotonic()
        self.monitor = SignalMonitor(cfg.monitor)
        self.warnings: list[str] = []
        self.progress_id = create_progress_artifact(
            progress=0.0 if self.stop > start else 100.0,
            key=artifact_key(cfg.run_name, "progress"),
            description=f"`{cfg.run_name}`: iterations {start}..{self.stop - 1} of this run "
            f"({cfg.num_rollout} in all).",
        )

    def _percent(self, done: int) -> float:
        return round(100.0 * (done - self.start) / max(1, self.stop - self.start), 1)

    def evaluated(self, rollout_id: int, result: dict) -> dict:
        """The eval's artifact; returns its metrics for the iteration's row (the sample
        completions stay in the artifact)."""
        create_markdown_artifact(
            markdown=eval_markdown(self.cfg.run_name, rollout_id, result),
            key=artifact_key(self.cfg.run_name, "eval"),
            description=f"Eval after iteration {rollout_id}: metrics and sample completions.",
        )
        return {key: v for key, v in result.items() if key != "examples"}

    def saved(self, result: dict) -> None:
        self.hf_export_uri = result.get("hf_export_uri") or self.hf_export_uri

    def iteration_done(self, rollout_id: int, row: dict) -> None:
        """Progress, and the warnings that learning stalls that start with this row."""
        for warning in self.monitor.observe(row):
            get_run_logger().warning("iter %04d | %s", rollout_id, warning)
            self.warnings.append(f"- iteration {rollout_id}: {warning}")
            create_markdown_artifact(
                markdown="\n".join(["# Learning warnings", "", *self.warnings]) + "\n",
                key=artifact_key(self.cfg.run_name, "learning-warnings"),
                description="Iterations at which learning looked stalled (monitor.*).",
            )
        now = time.monotonic()
        if rollout_id + 1 >= self.stop or now - self._progress_at >= PROGRESS_EVERY_S:
            update_progress_artifact(self.progress_id, self._percent(rollout_id + 1))
            self._progress_at = now

    def finish(self, outputs: dict) -> None:
        """Metrics table, reward curve and links to the outputs, once the loop is done."""
        cfg, store = self.cfg, RunStore(self.cfg.storage, self.cfg.run_name)
        rows = read_metrics(store)
        if rows:
            create_table_artifact(
                table=metrics_table(rows),
                key=artifact_key(cfg.run_name, "metrics"),
                description=f"Per-iteration metrics of `{cfg.run_name}` (all runs of it so far).",
            )
            store.write_bytes(CURVE_FILE, reward_curve_png(rows, f"{cfg.run_name}: reward per iteration"))
            self._link("reward-curve", store.uri(CURVE_FILE), "Reward curve (PNG)")
        self._link("checkpoint", outputs.get("checkpoint", ""), "Latest checkpoint")
        self._link("hf-export", self.hf_export_uri, "HF export (from_pretrained directory)")
        self._link("rollouts", outputs.get("rollouts", ""), "Rollouts (one parquet per iteration)")

    def _link(self, what: str, uri: str, text: str) -> None:
        if uri:
            create_link_artifact(
                link=link_of(uri), link_text=text, key=artifact_key(self.cfg.run_name, what), description=text
            )
