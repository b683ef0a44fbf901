"""Run every benchmark and write bench/RESULTS.md from what they print.

    python -m bench.suite                       # all of BENCHES (what `make bench` runs)
    python -m bench.suite --only bench.weight_sync bench.engine_throughput

Each benchmark is a script that measures both sides of its comparison in one run and
prints its figures; lines starting `RATIO` are its headline ratios. The results file holds
a description of the machine, then one section per benchmark (its command, the date it
ran and its printed output), and a table of every ratio. `--only` re-runs some benchmarks
and keeps the other sections as they were (each says when it was measured).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
BEGIN, END = "<!-- bench: {} -->", "<!-- end: {} -->"


@dataclass(frozen=True)
class Bench:
    module: str
    args: list[str] = field(default_factory=list)
    needs: str | None = None  # an optional package; the bench is skipped (and says so) without it
    timeout_s: int = 1800
    variant: str | None = None  # a second run of the same module: its section is `module[variant]`

    @property
    def key(self) -> str:
        """The bench's section in the results file, and its name for `--only`."""
        return f"{self.module}[{self.variant}]" if self.variant else self.module

    @property
    def command(self) -> str:
        return " ".join(["python -m", self.module, *self.args])


# The one list `make bench` runs; a new benchmark is one line here.
BENCHES: list[Bench] = [
    Bench("bench.engine_throughput"),
    Bench("bench.weight_sync"),
    # a sync's HTTP calls to 32-256 simulated engines: a thread per engine against EngineLanes
    Bench("bench.weight_fanout"),
    Bench("bench.trainer_throughput"),
    Bench("bench.batch_staging"),
    Bench("bench.reply_decoding"),
    Bench("bench.gc_freeze"),
    Bench("bench.trl_compare", needs="trl"),
    # SGLang's real server on CPU as the engine (needs `make sglang-venv`)
    Bench("bench.engine_learning"),
    Bench("bench.asyncio_driver"),
    Bench("bench.checkpoint_io"),
    Bench("bench.demo_footprint"),
    # the baseline: the commit before the command started the actors while the API server
    # boots (it writes the same timeline)
    Bench("bench.startup", ["--baseline", "36f3447"]),
    # the baseline: the commit before a rollout was staged on the trainer ranks when made
    # (the train call after the sync carried it, and each rank unpickled it then);
    # bench.task_run_chain keeps the comparison of the control workers with Ray tasks
    # (40 iterations x 4 pairs: with 20 x 3 the machine's drift hides changes of this size)
    Bench("bench.loop_overhead", ["--iterations", "40", "--repeats", "4", "--baseline", "13d1c0d"]),
    # the same with the run's storage on S3, against the commit before task results were
    # written without a lookup first (every task run's start paid an S3 round trip)
    Bench(
        "bench.loop_overhead",
        ["--iterations", "20", "--repeats", "3", "--baseline", "8c5ed87", "--s3"],
        variant="s3",
    ),
    Bench("bench.cpu_budget"),
    Bench("bench.task_run_cost"),
    Bench("bench.task_run_chain"),
    Bench("bench.param_walk"),
    Bench("bench.seed_robustness", timeout_s=3600),
    Bench("bench.memory_growth"),
    Bench("bench.scaling"),
    Bench("bench.lora_compare"),
    # the control plane at cluster scale against simulated engines (~15 minutes on 2 cores)
    Bench(
        "bench.scale_sweep",
        ["--points", "1x1k,8x1k,32x1k,128x1k,8x8k,32x8k,8x32k,256x8k", "--png", "bench/scale_sweep.png"],
        timeout_s=3600,
    ),
    # long-tailed responses with and without rollout.over_sample_prompts (~9 minutes)
    Bench("bench.long_tail", timeout_s=2400),
]


def machine() -> str:
    import psutil
    import torch

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M)
        cpu = names[0] if names else cpu
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    versions = []
    for name in ("torch", "ray", "prefect", "transformers", "trl"):
        try:
            versions.append(f"{name} {__import__(name).__version__}")
        except ImportError:
            continue
    return (
        f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.1f} GiB RAM, GPU: {gpu}; "
        f"Python {platform.python_version()}, {', '.join(versions)}"
    )


def run(bench: Bench) -> str:
    """The bench's section: command, date, printed output (or why it did not run)."""
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = f"## `{bench.key}`\n\n`{bench.command}` ({date})\n\n"
    if bench.needs and importlib.util.find_spec(bench.needs) is None:
        return head + f"Not run: needs `{bench.needs}` (`pip install -e .[bench]`).\n"
    print(f"== {bench.command}", flush=True)
    cmd = [sys.executable, "-m", bench.module, *bench.args]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=bench.timeout_s, check=False)
        out, status = proc.stdout, f"exit code {proc.returncode}" if proc.returncode else ""
    except subprocess.TimeoutExpired as exc:
        out, status = exc.stdout or "", f"timed out after {bench.timeout_s} s"
    print(out, flush=True)
    body = f"```\n{out.rstrip()}\n```\n"
    return head + body + (f"\n**Failed: {status}**\n" if status else "")


def _sections(text: str) -> dict[str, str]:
    found = re.findall(r"<!-- bench: (\S+) -->\n(.*?)<!-- end: \1 -->", text, re.S)
    return {module: body for module, body in found}


def write(sections: dict[str, str]) -> str:
    ratios = []
    for bench in BENCHES:
        for line in sections.get(bench.key, "").splitlines():
            if line.startswith("RATIO "):
                name, value = line[len("RATIO ") :].split(": ", 1)
                ratios.append(f"| {name} | {value.replace('; ', ' | ')} | `{bench.key}` |")
    parts = [
        "# Benchmark results\n",
        "Written by `make bench` (`python -m bench.suite`); do not edit by hand. Every benchmark "
        "measures both sides of its comparison in the same run, repeated, and prints median "
        "(min, max, n).\n",
        f"Machine: {machine()}.\n",
        "## Ratios\n",
        "| ratio | median (min, max, n) | goal | script |\n|---|---|---|---|",
        *ratios,
        "",
    ]
    for bench in BENCHES:
        if bench.key in sections:
            block = f"{BEGIN.format(bench.key)}\n{sections[bench.key]}{END.format(bench.key)}\n"
            parts.append(block)
    return "\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", help="modules to run; the other sections are kept")
    args = ap.parse_args()
    known = {b.key: b for b in BENCHES}
    unknown = [m for m in args.only or [] if m not in known]
    if unknown:
        raise SystemExit(f"--only: unknown bench {unknown}; known: {', '.join(known)}")
    sections = _sections(RESULTS.read_text()) if RESULTS.is_file() else {}
    failed = 0
    for bench in BENCHES:
        if args.only and bench.key not in args.only:
            continue
        sections[bench.key] = run(bench)
        failed += "**Failed" in sections[bench.key]
        RESULTS.write_text(write(sections))  # after each bench: a later failure keeps the earlier
    print(f"wrote {RESULTS}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
