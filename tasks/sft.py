"""Prefect tasks of the SFT stage: one epoch on every trainer rank, and the model's export."""

from __future__ import annotations

from prefect import get_run_logger, task

from infra.stage_handles import SFTHandles
from tasks.options import RETRIED, RUN_ALWAYS


# No retries: an optimizer step is not idempotent.
@task(name="sft", task_run_name="sft-{epoch:04d}", **RUN_ALWAYS)
def sft(run: SFTHandles, epoch: int) -> dict:
    metrics = run.epoch(epoch)
    get_run_logger().info(
        "sft epoch %d: loss %.4f, answer accuracy %.3f, token accuracy %.3f, grad norm %.3f, lr %.2e, %.2fs",
        epoch,
        metrics["loss"],
        metrics["answer_accuracy"],
        metrics["token_accuracy"],
        metrics["grad_norm"],
        metrics["lr"],
        metrics["time_sft_epoch_s"],
    )
    return metrics


# Idempotent: the same weights written to the same place.
@task(name="sft-export", task_run_name="sft-export", **RETRIED)
def sft_export(run: SFTHandles, metrics: dict) -> dict:
    done = run.export(metrics)
    get_run_logger().info(
        "fine-tuned model written to %s (%.2fs)", done["hf_export_uri"], done["time_export_s"]
    )
    return done
