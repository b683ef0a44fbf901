"""Prefect options shared by the loop's tasks."""

from prefect.cache_policies import NO_CACHE

# Caching off: a call must really run; results are still persisted (flows/results.py).
RUN_ALWAYS = {"cache_policy": NO_CACHE}
# For steps whose work is idempotent (generate, save, sync, eval): retry transient failures.
RETRIED = {**RUN_ALWAYS, "retries": 2, "retry_delay_seconds": 2}
