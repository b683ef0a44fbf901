"""The Prefect flow against a plain asyncio driver of the same loop, side by side in one run.

    python -m bench.asyncio_driver [--iterations 20 --repeats 5] [overrides...]

The driver brings up the same RLSystem and calls the same RunHandles methods, with the
same one-step-ahead overlap as flows/train.py (generate k+1 runs in a thread while train k
runs in another), but no Prefect: it is the loop's cost without orchestration. Both sides
run the demo config at 64 prompts x 16 samples with every group kept
(`bench.common.LOOP_SHAPE`) for the same iterations, alternating flow, driver, driver, flow, ...; each
records when each iteration started (`time_started_unix`), and seconds per iteration are
from one start to the next (so whatever either side overlaps across iterations counts as
it runs), iteration 0 (warm-up) left out. The figure is the ratio of the median seconds per
iteration, flow / driver, per repeat (the two runs of a repeat are next to each other).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import tempfile
import time

from bench.common import LOOP_SHAPE, ratio_line, spread, start_to_start, steal_share
from infra.config import RunConfig
from infra.config_files import load_config
from infra.preflight import preflight
from infra.schedule import LoopSchedule
from infra.secrets import API_KEY_ENV
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics
from infra.system import RLSystem


async def drive(cfg: RunConfig) -> None:
    """flows/train.py's loop (async mode, no colocation), each blocking call in a thread."""
    if cfg.cluster.colocate:
        raise ValueError("cluster.colocate: the driver bench runs the non-colocated loop only")

    def later(fn, *args) -> asyncio.Task:
        return asyncio.create_task(asyncio.to_thread(fn, *args))

    checked = preflight(cfg)  # as the flow: the same checks, and the train rows' count
    with RLSystem(cfg, {API_KEY_ENV: secrets.token_hex(24)}) as run:
        start = run.restore()
        schedule = LoopSchedule.from_config(cfg, checked.num_train_prompts, start)
        await asyncio.to_thread(run.sync, start)
        ahead = cfg.mode == "async"
        future, ready = later(run.generate, start), None
        for k in range(start, schedule.num_rollout):
            t0, row_started = time.monotonic(), time.time()
            if future is None and ready is None:
                future = later(run.generate, k)
            if future is not None:
                ready, future = await future, None
            rollout, ready = ready, None
            if ahead and schedule.has_next(k):
                future = later(run.generate, k + 1)
            row = {**rollout, **await asyncio.to_thread(run.train, k)}
            if schedule.sync_after(k):
                if future is not None:  # no generation in flight while weights change
                    ready, future = await future, None
                row.update(await asyncio.to_thread(run.sync, k + 1))
            if schedule.eval_after(k):
                result = await asyncio.to_thread(run.evaluate, k)
                row.update({key: v for key, v in result.items() if key != "examples"})
            row["time_iteration_s"] = time.monotonic() - t0
            row["time_started_unix"] = row_started
            run.record(row)
            if schedule.save_after(k):
                if future is not None:
                    ready, future = await future, None
                # as the flow: the writes overlap the next iterations, except the last save's
                await asyncio.to_thread(run.save, k, schedule.export_hf_after(k), not schedule.is_last(k))


def _run_flow(cfg: RunConfig) -> None:
    from flows.prefect_on_ray import ensure_api_server
    from flows.train import train

    ensure_api_server()
    state = train(cfg, return_state=True)
    if not state.is_completed():
        raise RuntimeError(f"the flow run ended {state.type}")


def _per_iteration(cfg: RunConfig) -> float:
    rows = read_metrics(RunStore(cfg.storage, cfg.run_name))
    times = list(start_to_start(rows).values())
    if len(times) != cfg.num_rollout - 2:
        raise RuntimeError(f"{cfg.run_name}: {len(times)} iteration periods, expected {cfg.num_rollout - 2}")
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--config", default="configs/tiny-demo.yaml")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    flow_s, driver_s = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            # which side goes first alternates, so a machine that drifts slower (or faster)
            # over the run weighs on both sides alike
            order = (("flow", flow_s), ("driver", driver_s))
            for side, times in order if i % 2 == 0 else order[::-1]:
                extra = [f"num_rollout={args.iterations}", f"storage.uri={tmp}", f"run_name={side}-{i}"]
                cfg = load_config(args.config, [*LOOP_SHAPE, *args.overrides, *extra])
                with steal_share() as machine:
                    if side == "driver":
                        asyncio.run(drive(cfg))
                    else:
                        _run_flow(cfg)
                times.append(_per_iteration(cfg))
                print(
                    f"repeat {i} {side}: {times[-1]:.3f} s/iteration (median, start to start, of iterations 1..);"
                    f" CPU steal {machine.get('steal', float('nan')):.1%}",
                    flush=True,
                )
    print(
        f"config: {args.config} {' '.join(args.overrides)}; {args.iterations} iterations; {os.cpu_count()} cores"
    )
    print(f"flow   s/iteration: {spread(flow_s)}")
    print(f"driver s/iteration: {spread(driver_s)}")
    ratios = [f / d for f, d in zip(flow_s, driver_s, strict=True)]
    print(ratio_line("prefect flow / asyncio driver, s per iteration", ratios, "<= 1.10x"))


if __name__ == "__main__":
    main()
