"""The demo task learned with each rollout engine, side by side in one run: the built-in
engine (the embedded defaults) and SGLang's real server on CPU (configs/sglang-cpu.yaml),
same task, model, seeds and iterations; only the engine differs.

    python -m bench.engine_learning [--target 0.9] [overrides...]

Needs the SGLang environment (`make sglang-venv`). The runs go one after the other (side by
side on 2 cores they would slow each other). Prints, per engine, the wall time, the engine's
start (from the placement groups to the engines answering, the run's `startup.json`), the
first iteration whose train reward reaches the target and the final held-out accuracy,
then the reward of every iteration in two columns, and `RATIO` lines (SGLang / built-in).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import psutil

from bench.seed_robustness import run_seed, summarize
from infra.config_files import load_config
from infra.handles import STARTUP_FILE
from infra.storage.fs import RunStore

REPO = Path(__file__).resolve().parents[1]
SIDES = {"builtin": None, "sglang": str(REPO / "configs" / "sglang-cpu.yaml")}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=float, default=0.9, help="train reward target")
    parser.add_argument("overrides", nargs="*", help="key.path=value applied to both runs")
    args = parser.parse_args(argv)
    mem = psutil.virtual_memory().total / 2**30
    print(f"machine: {os.cpu_count()} cores, {mem:.0f} GiB; overrides: {args.overrides}")
    runs = {}
    for side, config in SIDES.items():
        overrides = [*args.overrides, f"run_name=engine-learning-{side}", "checkpoint.resume=fresh"]
        wall, rows = run_seed(config, overrides)
        res = {**summarize(rows, args.target), "engine_start_s": _engine_start(config, overrides)}
        runs[side] = (wall, rows, res)
    for side, (wall, _, res) in runs.items():
        print(
            f"{side}: wall {wall:.1f} s, engine start {res['engine_start_s']:.1f} s, "
            f"{res['iterations']} iterations, reward >= {args.target} first at "
            f"iteration {res['reward_target_iter']}, final reward {res['final_reward']:.3f} (last 3), "
            f"final held-out accuracy {res['final_eval']}"
        )
    print(" iter | builtin reward | sglang reward")
    builtin, sglang = runs["builtin"][1], runs["sglang"][1]
    for a, b in zip(builtin, sglang, strict=False):
        print(f" {a['rollout_id']:4d} | {a['reward_mean']:14.3f} | {b['reward_mean']:13.3f}")
    print(f"RATIO wall time sglang/builtin: {runs['sglang'][0] / runs['builtin'][0]:.2f}x")
    start = runs["sglang"][2]["engine_start_s"] / runs["builtin"][2]["engine_start_s"]
    print(f"RATIO engine start sglang/builtin: {start:.2f}x")
    return 0


def _engine_start(config: str | None, overrides: list[str]) -> float:
    """Seconds from the placement groups to the engines answering /health, for that run."""
    cfg = load_config(config, overrides)
    marks = json.loads(RunStore(cfg.storage, cfg.run_name).read_text(STARTUP_FILE))[
        "seconds_since_process_start"
    ]
    return marks["engines_up"] - marks["placement_groups"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
