"""One point of the scale sweep: E simulated engines, N samples an iteration, the real flow.

The run is `python -m flows.train` (the real Prefect flow on the real Ray task runner, the
real rollout manager and local storage) attached to simulated engines already running
(`rollout.engine_urls`, bench/sim_engine.py) with the trainer stand-in
(`cluster.trainer_class`, bench/sim_trainer.py). Between the end of iteration `first` and
the end of `last`, it reads per process role (bench/process_roles.py) the CPU time, and at the
end PSS; the simulated engines' processes are read the same way, apart.

The physical limit of an iteration is what the simulation allows with no control plane:
generation of its samples with ideal spread over every slot of every engine, or its longest
sample, whichever is longer; training and sync as the stand-in waits them. In async mode the
period from the start of iteration k to that of k+1 overlaps training on k with generating
k+1, and the sync waits for both (no generation may be in flight while weights change; the
next generate and training both start after it), so its limit is
max(T_gen(k+1), T_train) + T_sync.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import yaml

from bench.common import REPO, start_to_start
from bench.process_roles import cpu_by_pid, iterations_done, pss_by_role, role_of
from bench.sim_engine import SimSpec
from bench.sim_trainer import ENV as TRAINER_ENV
from infra.config import RunConfig

GROUP = 16  # samples per prompt (a GRPO group)
PROMPTS = 4096  # rows of the prompt file: enough distinct prompts for 32k samples a batch
ENGINES_PER_PROC = 64  # simulated engines per process (one event loop serves them all)
# process roles (bench/process_roles.py) gathered into what the report names
ROLE_GROUPS = {
    "flow (driver)": "flow driver",
    "prefect server": "prefect server",
    "ray RolloutManager": "rollout manager",
    "ray ControlWorker": "ray task workers",
    "ray task workers": "ray task workers",
    "ray SimTrainerRank": "trainer stand-in",
}
CONTROL_PLANE = ["flow driver", "prefect server", "rollout manager", "ray task workers", "ray system"]


@dataclass
class PointSpec:
    engines: int
    samples: int
    iterations: int = 5  # iterations 1..iterations-2 are measured (0 warms up; the last saves)
    target_s: float = 6.0  # the ideal generate time the engines' speed is set for
    train_share: float = 0.8  # T_train + T_sync as a share of target_s
    sync_s: float = 0.2
    median_tokens: float = 64.0
    slots: int = 64
    over_sample: int = 0  # rollout.over_sample_prompts


def group_of(role: str) -> str:
    if role in ROLE_GROUPS:
        return ROLE_GROUPS[role]
    return "ray system" if role.startswith("ray ") else role


def engine_speed(spec: PointSpec) -> float:
    """Per-slot tokens/s that make iteration 1's ideal generate time `target_s`: its lengths
    follow from the sampling seeds the rollout manager gives (rollout.seed * 2^40 + rollout id *
    2^20 + sample index); other iterations' limits are computed from what they generated."""
    sim = SimSpec(median_tokens=spec.median_tokens, slots=spec.slots)
    base = RunConfig().rollout.seed * 2**40 + 1 * 2**20
    lengths = [sim.length(base + i) for i in range(spec.samples)]
    return max(sum(lengths) / (spec.engines * spec.slots), max(lengths)) / spec.target_s


def ideal_generate_s(lengths: list[int], engines: int, slots: int, rate: float) -> float:
    return max(sum(lengths) / (engines * slots), max(lengths)) / rate


def start_engines(spec: PointSpec, rate: float, tmp: Path) -> tuple[list[subprocess.Popen], list[str]]:
    sim = json.dumps(
        asdict(SimSpec(median_tokens=spec.median_tokens, slots=spec.slots, slot_tokens_per_s=rate))
    )
    procs, files = [], []
    for first in range(0, spec.engines, ENGINES_PER_PROC):
        count = min(ENGINES_PER_PROC, spec.engines - first)
        f = tmp / f"urls-{first}.json"
        cmd = [sys.executable, "-m", "bench.sim_engine", "--engines", str(count), "--first-index", str(first)]
        procs.append(subprocess.Popen([*cmd, "--spec", sim, "--url-file", str(f)], cwd=REPO))
        files.append(f)
    deadline = time.monotonic() + 60
    while not all(f.exists() for f in files):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError("simulated engines did not start")
        time.sleep(0.1)
    return procs, [u for f in files for u in json.loads(f.read_text())]


def write_run_config(spec: PointSpec, urls: list[str], tmp: Path) -> Path:
    prompts = tmp / "prompts.jsonl"
    with prompts.open("w") as f:
        for i in range(PROMPTS):
            f.write(json.dumps({"prompt": f"{i:04d}:", "label": f"{i:04d}"}) + "\n")
    tree = {
        "run_name": "scale",
        "num_rollout": spec.iterations,
        "storage": {"uri": str(tmp / "runs")},
        "checkpoint": {"resume": "fresh", "save_interval": None},  # saved once, at the end
        "eval": {"interval": None},
        "data": {"train_path": str(prompts)},
        "model": {"tiny": {"max_position_embeddings": 8192}},
        "rollout": {
            "engine_urls": urls,
            "prompts_per_rollout": spec.samples // GROUP,
            "over_sample_prompts": spec.over_sample,
            "n_samples_per_prompt": GROUP,
            "sampling": {"max_new_tokens": 4096},
            # one round a batch: the simulated rewards are all 0, so dynamic sampling (on by
            # default) would draw every prompt again up to its round limit
            "dynamic_sampling": False,
        },
        "cluster": {"trainer_class": "bench.sim_trainer:SimTrainerRank", "trainer": {"num_workers": 1}},
    }
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def _read(root: psutil.Process, engines: list[psutil.Process]) -> tuple[float, dict[str, float]]:
    """(now, CPU seconds so far by role group), engines' processes as `simulated engines`."""
    cpu: dict[str, float] = defaultdict(float)
    for _, (role, seconds) in cpu_by_pid(root).items():
        cpu[group_of(role)] += seconds
    for p in engines:
        t = p.cpu_times()
        cpu["simulated engines"] += t.user + t.system
    return time.monotonic(), dict(cpu)


def _memory(root: psutil.Process, engines: list[psutil.Process]) -> dict[str, int]:
    mem: dict[str, int] = defaultdict(int)
    for role, (pss, _) in pss_by_role(root).items():
        mem[group_of(role)] += pss
    for p in engines:
        info = p.memory_full_info()
        mem["simulated engines"] += getattr(info, "pss", info.rss)
    return dict(mem)


def _written(root: psutil.Process) -> dict[str, int]:
    """Bytes each role group has written so far (/proc/<pid>/io write_bytes)."""
    out: dict[str, int] = defaultdict(int)
    for p in [root, *root.children(recursive=True)]:
        try:
            out[group_of(role_of(p, root.pid))] += p.io_counters().write_bytes
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return dict(out)


def _engine_requests(urls: list[str]) -> dict[str, int]:
    import httpx

    total: dict[str, int] = defaultdict(int)
    with httpx.Client(timeout=10) as http:
        for url in urls:
            for route, n in http.get(f"{url}/sim_stats").json()["routes"].items():
                total[route] += n
    return dict(total)


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _start_flow(spec: PointSpec, config: Path, s_per_sample: float, log: Path) -> subprocess.Popen:
    """`flows.train` on the point's config, with the trainer stand-in's timings in its env."""
    env = {**os.environ, TRAINER_ENV: json.dumps({"s_per_sample": s_per_sample, "sync_s": spec.sync_s})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "flows.train", "--config", str(config)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def _limits(
    spec: PointSpec, run_dir: Path, window: list[int], t_train: float, rate: float
) -> tuple[dict[int, float], dict[int, float], list[int]]:
    """Per iteration k of the window: the physical limit and the ideal generate time of the
    samples it kept; and every kept sample's staleness (rollout id minus weight version)."""
    limits, ideal, lags = {}, {}, []
    for k in window:  # the period of k holds the generation of k + 1 (see the docstring)
        table = pq.read_table(
            run_dir / "rollouts" / f"{k + 1:07d}.parquet", columns=["response_ids", "weight_version"]
        )
        lens = [len(x) for x in table.column("response_ids").to_pylist()]
        lags += [k + 1 - v for v in table.column("weight_version").to_pylist()]
        ideal[k] = ideal_generate_s(lens, spec.engines, spec.slots, rate)
        limits[k] = max(ideal[k], t_train) + spec.sync_s
    return limits, ideal, lags


def _long_tail_figures(by_row: dict[int, dict], window: list[int], lags: list[int]) -> dict:
    """The kept samples' staleness, and per iteration what over-sampling threw away."""
    keys = ("over_sample_aborted_groups", "over_sample_unsent_groups", "over_sample_wasted_tokens")
    return {
        "staleness_mean": sum(lags) / len(lags),
        "staleness_max": max(lags),
        "over_sample_stats": {
            key: sum(by_row[k + 1].get(key, 0) for k in window) / len(window) for key in keys
        },
    }


def run_point(spec: PointSpec, tmp: Path, log: Path, timeout_s: float = 900) -> dict:
    """Run one point; its figures (see bench/scale_sweep.py for the table)."""
    first, last = 1, spec.iterations - 1
    rate = engine_speed(spec)
    s_per_sample = max(0.0, spec.target_s * spec.train_share - spec.sync_s) / spec.samples
    procs, urls = start_engines(spec, rate, tmp)
    engine_procs = [psutil.Process(p.pid) for p in procs]
    try:
        flow = _start_flow(spec, write_run_config(spec, urls, tmp), s_per_sample, log)
        root, t_start = psutil.Process(flow.pid), time.monotonic()
        metrics, run_dir = tmp / "runs" / "scale" / "metrics.jsonl", tmp / "runs" / "scale"
        reads = []
        for mark in (first, last):
            while iterations_done(metrics) < mark and flow.poll() is None:
                if time.monotonic() - t_start > timeout_s:
                    flow.kill()
                    raise RuntimeError(f"point {spec.engines}x{spec.samples}: over {timeout_s} s")
                time.sleep(0.05)
            if flow.poll() is not None:
                break
            reads.append((*_read(root, engine_procs), _written(root), _engine_requests(urls), _du(run_dir)))
            if mark == last:
                memory = _memory(root, engine_procs)
        rc = flow.wait(timeout=timeout_s)
        if rc or len(reads) < 2:
            raise RuntimeError(f"point {spec.engines}x{spec.samples}: the flow exited {rc}; see {log}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    (t0, cpu0, w0, r0, du0), (t1, cpu1, w1, r1, du1) = reads
    n = last - first
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    periods = start_to_start(rows)
    window = [k for k in range(first, last) if k in periods]
    t_train = spec.samples * s_per_sample
    limits, ideal, lags = _limits(spec, run_dir, window, t_train, rate)
    by_row = {r["rollout_id"]: r for r in rows if "rollout_id" in r}
    wall = t1 - t0
    return {
        **asdict(spec),
        "slot_tokens_per_s": rate,
        "iteration_s": sum(periods[k] for k in window) / len(window),
        "limit_s": sum(limits.values()) / len(window),
        "ratios": [periods[k] / limits[k] for k in window],  # iteration / limit, per iteration
        "generate_s": sum(by_row[k + 1]["time_generate_s"] for k in window) / len(window),
        "ideal_generate_s": sum(ideal.values()) / len(window),
        # the sync as the trainer measures it: the simulated broadcast (sync_s) and the HTTP calls
        "sync_measured_s": sum(by_row[k]["time_sync_s"] for k in window) / len(window),
        "cpu_s": {role: (cpu1.get(role, 0.0) - cpu0.get(role, 0.0)) / n for role in cpu1},
        "wall_s": wall / n,
        "requests_per_s": {route: (r1.get(route, 0) - r0.get(route, 0)) / wall for route in r1},
        "written_bytes": {role: (w1.get(role, 0) - w0.get(role, 0)) / n for role in w1},
        "run_dir_bytes": (du1 - du0) / n,
        "memory": memory,
        **_long_tail_figures(by_row, window, lags),
    }
