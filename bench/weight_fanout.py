"""The HTTP side of a weight sync to many engines: a thread per engine against one event loop.

    python -m bench.weight_fanout [--engines 32 128 256] [--syncs 25]

A sync makes five calls to every engine, each engine's in order: /pause_generation and
/begin_weight_update, one /update_weights_from_distributed, /end_weight_update and
/continue_generation (no broadcast here: the engines are bench/sim_engine.py's, which answer
at once). Side by side on the same engines:

- threads: a thread per engine, each making its engine's calls through its EngineClient
  (httpx, a connection kept alive per engine);
- lanes: the trainer stand-in's sync (bench/sim_trainer.py), which makes the calls as
  `BroadcastSender` does: a lane per engine on one event loop (infra/engines/lanes.py).

Per sync: the wall time and the CPU time of the calling process (the trainer rank 0's, on
the iteration's critical path), median over the syncs after the first 5.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tempfile import TemporaryDirectory

from bench.common import REPO, ratio_line
from bench.sim_trainer import ENV, SimTrainerRank
from infra.config import RunConfig
from infra.engines.client import PAUSE_MODE, EngineClient

WARMUP = 5


def _engines(count: int, tmp: str) -> tuple[subprocess.Popen, list[str]]:
    url_file = Path(tmp) / f"urls-{count}.json"
    cmd = [sys.executable, "-m", "bench.sim_engine", "--engines", str(count), "--url-file", str(url_file)]
    proc = subprocess.Popen(cmd, cwd=REPO)
    deadline = time.monotonic() + 60
    while not url_file.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("simulated engines did not start")
        time.sleep(0.1)
    return proc, json.loads(url_file.read_text())


def _thread_per_engine(urls: list[str]) -> tuple[Callable[[int], None], Callable[[], None]]:
    clients = [EngineClient(url, 60) for url in urls]
    pool = ThreadPoolExecutor(len(clients), thread_name_prefix="fanout")

    def each(fn: Callable[[EngineClient], object]) -> None:
        for request in [pool.submit(fn, client) for client in clients]:
            request.result()

    def sync(version: int) -> None:
        def pause(c: EngineClient) -> None:
            c.pause_generation(PAUSE_MODE)
            c.begin_weight_update()

        def resume(c: EngineClient) -> None:
            c.end_weight_update()
            c.continue_generation()

        each(pause)
        each(
            lambda c: c.update_weights_from_distributed(
                ["sim"], ["float32"], [[1]], "g", weight_version=str(version)
            )
        )
        each(resume)

    def close() -> None:
        pool.shutdown()
        for client in clients:
            client.close()

    return sync, close


def _lanes(urls: list[str]) -> tuple[Callable[[int], None], Callable[[], None]]:
    os.environ[ENV] = json.dumps({"sync_s": 0.0})
    rank = SimTrainerRank(RunConfig(), 0, 1)
    rank.connect_engines(urls)
    rank.group = "g"
    return rank.update_weights, rank.shutdown


def _measure(sync: Callable[[int], None], syncs: int) -> tuple[float, float]:
    walls, cpus = [], []
    for version in range(syncs):
        c0, t0 = time.process_time(), time.perf_counter()
        sync(version)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls[WARMUP:]), statistics.median(cpus[WARMUP:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", type=int, nargs="+", default=[32, 128, 256])
    ap.add_argument("--syncs", type=int, default=25)
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores; {args.syncs} syncs per row, the first {WARMUP} left out")
    print("| engines | fan-out | wall ms per sync | caller CPU ms per sync | caller CPU ms per call |")
    print("|---|---|---|---|---|")
    ratios = {}
    with TemporaryDirectory() as tmp:
        for count in args.engines:
            proc, urls = _engines(count, tmp)
            try:
                figures = {}
                for name, make in (("threads", _thread_per_engine), ("lanes", _lanes)):
                    sync, close = make(urls)
                    try:
                        figures[name] = _measure(sync, args.syncs)
                    finally:
                        close()
                    wall, cpu = figures[name]
                    print(
                        f"| {count} | {name} | {wall * 1e3:.1f} | {cpu * 1e3:.1f} | {cpu * 1e3 / (5 * count):.3f} |"
                    )
                ratios[count] = figures
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    for count, figures in ratios.items():
        (t_wall, t_cpu), (l_wall, l_cpu) = figures["threads"], figures["lanes"]
        print(ratio_line(f"sync wall time, lanes / threads, {count} engines", [l_wall / t_wall], "< 1x"))
        print(ratio_line(f"sync caller CPU, lanes / threads, {count} engines", [l_cpu / t_cpu], "< 1x"))


if __name__ == "__main__":
    main()
