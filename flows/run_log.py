"""The flow run's own log lines, between its task runs' lines: what the run covers, where
its start-up time went, one line per iteration, and where its outputs are."""

from __future__ import annotations

from prefect import get_run_logger

from infra.config import RunConfig


def log_start(config: RunConfig, start: int, stop: int) -> None:
    get_run_logger().info("run %s: iterations %d..%d, mode %s", config.run_name, start, stop - 1, config.mode)


def log_startup(timeline: dict[str, float]) -> None:
    """Where the time from the command to the first generate went."""
    get_run_logger().info("startup, seconds since the command: %s", timeline)


def log_iteration(k: int, row: dict) -> None:
    get_run_logger().info(
        "iter %04d | reward %.3f | generate %.2fs train %.2fs sync %.2fs | weight version %d",
        k,
        row["reward_mean"],
        row["time_generate_s"],
        row["time_train_s"],
        row.get("time_sync_s", 0.0),
        row["weight_version"],
    )


def log_outputs(outputs: dict[str, str]) -> None:
    log = get_run_logger()
    for name, uri in outputs.items():
        log.info("%s: %s", name, uri)
