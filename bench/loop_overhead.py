"""The loop's orchestration overhead: run the demo at 64 prompts x 16 samples with every
group kept (`bench.common.LOOP_SHAPE`) for N iterations and print the medians of its
per-iteration timings from the run's metrics.jsonl.

    python -m bench.loop_overhead [--iterations 30] [--repeats 1] [--baseline GIT_REF] [--s3] [overrides...]

With `--baseline`, the same run also goes from a checkout of that commit, alternating with
this code's runs so both see the same machine load, and the ratios of the two sides' medians
are printed per repeat.

Per iteration k, from its start to the next one's (the period: what the loop's throughput
is made of; the first iteration, which waits for the first generate, is left out, and so
are iterations next to an eval or a save, which have their own costs):
  overhead = period - max(generate, train + sync)
  overlap efficiency = max(generate, train + sync) / period
An iteration starts when its training can: when the flow starts it, or, where it was
submitted ahead (flows/ahead.py), when the previous sync returned. `iteration_s` is the
median of the rows' own `time_iteration_s`; `period_save_s` the median period of the
iterations that saved (by the flow's own schedule).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import nullcontext
from pathlib import Path

from bench.common import LOOP_SHAPE, moto_s3, ratio_line, sides, spread, start_to_start, steal_share


def summarize(rows: list[dict], saved: set[int]) -> dict:
    rows = sorted(rows, key=lambda r: r["rollout_id"])
    steady = rows[1:]
    evaluated = {r["rollout_id"] for r in rows if "time_eval_s" in r}
    med = lambda xs: round(statistics.median(xs), 3) if xs else None  # noqa: E731

    def busy(r: dict) -> float:
        return max(r["time_generate_s"], r["time_train_s"] + r.get("time_sync_s", 0.0))

    periods = start_to_start(rows)
    special = saved | evaluated
    plain = [
        r
        for r in steady
        if r["rollout_id"] in periods and not {r["rollout_id"], r["rollout_id"] - 1} & special
    ]
    return {
        "iterations": len(plain),
        "iteration_s": med([r["time_iteration_s"] for r in steady]),
        "generate_s": med([r["time_generate_s"] for r in plain]),
        "train_s": med([r["time_train_s"] for r in plain]),
        "sync_s": med([r.get("time_sync_s", 0.0) for r in plain]),
        "overhead_s": med([periods[r["rollout_id"]] - busy(r) for r in plain]),
        "overlap_efficiency": med([busy(r) / periods[r["rollout_id"]] for r in plain]),
        "period_s": med([periods[r["rollout_id"]] for r in plain]),
        "period_save_s": med([p for k, p in periods.items() if k in saved]),
    }


def save_iterations(iterations: int, overrides: list[str]) -> set[int]:
    """The iterations after which the flow saved, by the flow's own schedule."""
    from infra.config_files import load_config
    from infra.data.prompts import load_rows, with_split
    from infra.data.splits import train_and_eval_rows
    from infra.schedule import LoopSchedule
    from infra.storage.fs import storage_options

    cfg = load_config(None, overrides)
    d = cfg.data
    opts = storage_options(cfg.storage)
    rows = load_rows(with_split(d.train_path, "train"), d.prompt_key, d.label_key, opts)
    schedule = LoopSchedule.from_config(cfg, len(train_and_eval_rows(cfg, rows, opts)[0]))
    return {k for k in range(iterations) if schedule.save_after(k)}


def run_once(iterations: int, overrides: list[str], code: Path, s3: str | None = None) -> dict:
    """One demo run of the code in `code`; its summary (the demo's own log goes to stderr).
    With `s3` (a bucket), the run's storage is a fresh prefix there instead of a local folder."""
    import fsspec

    with tempfile.TemporaryDirectory() as local:
        root = f"{s3}/{uuid.uuid4().hex[:12]}" if s3 else local
        settings = [
            *LOOP_SHAPE, f"num_rollout={iterations}", f"storage.uri={root}", "run_name=loop-overhead", *overrides
        ]  # fmt: skip
        t0 = time.monotonic()
        with steal_share() as machine:
            rc = subprocess.call(
                [sys.executable, "-m", "flows.train", *settings], cwd=code, stdout=sys.stderr
            )
        wall = time.monotonic() - t0
        if rc:
            raise SystemExit(f"the demo ({code}) exited with {rc}")
        with fsspec.open(f"{root}/loop-overhead/metrics.jsonl", "r") as f:
            rows = [json.loads(line) for line in f.read().splitlines() if line]
    summary = summarize(rows, save_iterations(iterations, settings))
    return {"wall_s": round(wall, 1), **summary, "cpu_steal": machine.get("steal")}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loop_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--baseline", help="a commit to measure too, alternating with this code")
    parser.add_argument(
        "--s3", action="store_true", help="the runs' storage on S3 (a moto server on loopback)"
    )
    parser.add_argument("overrides", nargs="*", help="key.path=value settings for the demo config")
    args = parser.parse_args(argv)
    storage = "storage on S3 (moto server on loopback)" if args.s3 else "local storage"
    print(
        f"demo, {args.iterations} iterations, {args.repeats} run(s) per side, {storage} {' '.join(args.overrides)}"
    )
    with tempfile.TemporaryDirectory() as tmp, moto_s3() if args.s3 else nullcontext() as bucket:
        code_of = sides(args.baseline, Path(tmp))
        runs: dict[str, list[dict]] = {name: [] for name in code_of}
        for _ in range(args.repeats):
            for name, code in code_of.items():
                runs[name].append(run_once(args.iterations, args.overrides, code, bucket))
                print(f"{name}: {json.dumps(runs[name][-1])}", flush=True)
    for name, results in runs.items():
        for key in ("iteration_s", "generate_s", "train_s", "sync_s", "overhead_s", "overlap_efficiency"):
            print(f"{name}: {key:20s} {spread([r[key] for r in results])}")
    mine = runs["this code"]
    on = ", storage on S3" if args.s3 else ""
    print(
        ratio_line(
            f"loop overlap efficiency, this code{on}", [r["overlap_efficiency"] for r in mine], ">= 0.9"
        )
    )
    if len(runs) == 2:
        before = next(iter(runs.values()))
        pairs = list(zip(before, mine, strict=True))
        print(
            ratio_line(
                f"loop orchestration overhead per iteration, baseline / this code{on}",
                [b["overhead_s"] / a["overhead_s"] for b, a in pairs],
                "this code's overhead <= 0.1 s",
            )
        )
        print(
            ratio_line(
                f"loop iteration time, baseline / this code{on}",
                [b["iteration_s"] / a["iteration_s"] for b, a in pairs],
                "none (diagnostic)",
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
