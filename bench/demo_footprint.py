"""Run the demo as a user would and measure its wall time and peak memory, summed over
every process it starts (driver, Prefect API server, Ray head, workers, actors, engines).

    python -m bench.demo_footprint [overrides...]

Memory is sampled twice a second as the sum of PSS over the process tree (RSS where PSS is
unavailable); PSS splits shared pages between the processes, so the sum does not count
shared libraries once per process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import psutil


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


def main(argv: list[str]) -> int:
    cmd = [sys.executable, "-m", "flows.train", *argv]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd)
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
    result = {
        "exit_code": rc,
        "wall_s": round(time.monotonic() - t0, 1),
        "peak_pss_gib": round(peak["pss"] / 2**30, 2),
        "peak_rss_sum_gib": round(peak["rss"] / 2**30, 2),
        "max_processes": peak["procs"],
    }
    print(json.dumps(result))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
