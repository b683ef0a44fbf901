"""Small helpers every bench script shares: repeat statistics and the printed lines."""

from __future__ import annotations

import os
import statistics
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Every group kept: dynamic sampling (on by default) draws extra rounds while most groups
# agree, so the work of an iteration would follow what the policy has learnt, which differs
# between runs and sides. The loop benches time a fixed amount of work.
ONE_ROUND = ["rollout.dynamic_sampling=false"]
# The loop benches' batch: 64 prompts x 16 samples of one new token, every group kept.
LOOP_SHAPE = ["rollout.prompts_per_rollout=64", "rollout.n_samples_per_prompt=16", *ONE_ROUND]


def spread(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    """`median (min .. max, n=K)` of repeated measurements."""
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"{fmt.format(mid)} (min {fmt.format(lo)}, max {fmt.format(hi)}, n={len(values)})"


def ratio_line(name: str, ratios: Sequence[float], goal: str) -> str:
    """The one line the results file quotes: the ratio's median, min and max, and its goal."""
    return f"RATIO {name}: {spread(ratios, '{:.2f}x')}; goal {goal}"


def start_to_start(rows: Sequence[dict]) -> dict[int, float]:
    """Seconds from each iteration's start to the next one's (`time_started_unix` of the
    metrics rows), the first iteration (warm-up, waiting for the first generate) left out:
    what the loop's throughput is made of, whatever the flow overlaps across iterations."""
    starts = {r["rollout_id"]: r["time_started_unix"] for r in rows if "time_started_unix" in r}
    first = min(starts, default=0)
    return {k: starts[k + 1] - t for k, t in starts.items() if k > first and k + 1 in starts}


def checkout(ref: str, into: Path) -> Path | None:
    """The tree of commit `ref` in `into` (None when this repository lacks it), to run a
    baseline side by side with this code."""
    known = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{ref}^{{commit}}"], check=False)
    if known.returncode:
        return None
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], stdout=subprocess.PIPE, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def sides(baseline: str | None, tmp: Path) -> dict[str, Path]:
    """Where each side's code is: this checkout, and first the `baseline` commit's tree
    (checked out under `tmp`) when one is given and this repository has it."""
    if baseline:
        base = checkout(baseline, tmp / "baseline")
        if base is not None:
            return {f"baseline {baseline[:10]}": base, "this code": REPO}
        print(f"baseline {baseline}: not in this repository, not measured")
    return {"this code": REPO}


# column of the `cpu` line of /proc/stat: user nice system idle iowait irq softirq steal ...
STEAL_COLUMN = 7


def _cpu_ticks() -> list[int] | None:
    """The machine's CPU time counters (the `cpu` line of /proc/stat), None off Linux."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


@contextmanager
def steal_share() -> Iterator[dict[str, float]]:
    """Share of the machine's CPU time that the hypervisor gave to other guests (steal)
    while the block ran; filled in `["steal"]` on leaving (absent where unreadable).

    On a shared virtual machine steal comes in episodes: a run that met one is slower on
    both sides of a comparison, so each run's share is printed next to its figure."""
    out: dict[str, float] = {}
    before = _cpu_ticks()
    try:
        yield out
    finally:
        after = _cpu_ticks()
        if before and after and len(after) > STEAL_COLUMN:
            delta = [b - a for a, b in zip(before, after, strict=False)]
            if sum(delta) > 0:
                out["steal"] = round(delta[STEAL_COLUMN] / sum(delta), 3)


@contextmanager
def moto_s3(bucket: str = "bench") -> Iterator[str]:
    """A moto S3 server on loopback (a real S3 HTTP API) with `bucket` made, for the time of
    the block; its endpoint and credentials are in this process's environment, which child
    processes inherit. Yields `s3://bucket`."""
    import s3fs

    from infra.storage.local_s3 import AWS_SETTINGS_TO_CLEAR, aws_env, moto_server

    with moto_server() as endpoint:
        for name in AWS_SETTINGS_TO_CLEAR:
            os.environ.pop(name, None)
        os.environ.update(aws_env(endpoint, key="bench"))
        s3fs.S3FileSystem().mkdir(bucket)
        yield f"s3://{bucket}"
