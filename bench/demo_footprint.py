"""Run the demo as a user would and measure its wall time and peak memory, summed over
every process it starts (driver, Prefect API server, Ray head, workers, actors, engines).

    python -m bench.demo_footprint [--repeats 3] [overrides...]

Memory is sampled twice a second as the sum of PSS over the process tree (RSS where PSS is
unavailable); PSS splits shared pages between the processes, so the sum does not count
shared libraries once per process. Each repeat writes to a fresh folder (storage.uri);
the per-iteration timings and rewards come from that run's metrics rows. The demo's own
log goes to stderr; the figures go to stdout.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psutil

from bench.common import spread
from infra.config_files import load_config
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics


def _tree_memory(root: psutil.Process) -> tuple[int, int, int]:
    procs = [root]
    try:
        procs += root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0, 0, 0
    pss = rss = 0
    for p in procs:
        try:
            info = p.memory_full_info()
            pss += getattr(info, "pss", info.rss)
            rss += info.rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return pss, rss, len(procs)


def run_demo(overrides: list[str]) -> dict:
    cmd = [sys.executable, "-m", "flows.train", *overrides]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=sys.stderr)
    root = psutil.Process(proc.pid)
    peak = {"pss": 0, "rss": 0, "procs": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            pss, rss, n = _tree_memory(root)
            peak["pss"], peak["rss"] = max(peak["pss"], pss), max(peak["rss"], rss)
            peak["procs"] = max(peak["procs"], n)
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rc = proc.wait()
    done.set()
    sampler.join()
    if rc:
        raise SystemExit(f"the demo exited with {rc}")
    return {
        "wall_s": time.monotonic() - t0,
        "pss_gib": peak["pss"] / 2**30,
        "rss_gib": peak["rss"] / 2**30,
        "procs": peak["procs"],
    }


def _timings(rows: list[dict]) -> None:
    train_rows = [r for r in rows if "time_iteration_s" in r]
    steps = [r for r in train_rows if r["rollout_id"] > 0]
    print(f"iterations: {len(train_rows)}; per iteration over iterations 1..{len(train_rows) - 1}:")
    for key in ("time_generate_s", "time_train_s", "time_sync_s", "time_eval_s", "time_iteration_s"):
        values = [r[key] for r in steps if r.get(key) is not None]
        if values:
            print(f"  {key:18s} {spread(values, '{:.2f}')} s")
    rewards = [r["reward_mean"] for r in train_rows]
    print(f"mean reward: iteration 0 {rewards[0]:.3f}; last 3 iterations {statistics.mean(rewards[-3:]):.3f}")
    evals = [(r["rollout_id"], r["eval_reward_mean"]) for r in rows if r.get("eval_reward_mean") is not None]
    if evals:
        print("eval reward by iteration: " + ", ".join(f"{k}: {v:.3f}" for k, v in evals))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("overrides", nargs="*", help="key.path=value settings for the demo")
    args = ap.parse_args(argv)
    results, rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            overrides = [*args.overrides, f"storage.uri={tmp}/run{i}"]
            results.append(run_demo(overrides))
            cfg = load_config(None, overrides)
            rows = read_metrics(RunStore(cfg.storage, cfg.run_name))
    print(f"python -m flows.train {' '.join(args.overrides)}: {args.repeats} runs")
    print(f"wall time, start to exit: {spread([r['wall_s'] for r in results], '{:.1f}')} s")
    print(
        f"peak memory, sum of PSS over all processes: {spread([r['pss_gib'] for r in results], '{:.2f}')} GiB"
    )
    print(
        f"peak memory, sum of RSS (shared pages per process): {spread([r['rss_gib'] for r in results], '{:.2f}')} GiB"
    )
    print(f"processes at peak: {max(r['procs'] for r in results)}")
    print("last run:")
    _timings(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
