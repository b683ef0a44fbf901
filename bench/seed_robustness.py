"""Run one config with several seeds, one run after another, and print how each learned.

    python -m bench.seed_robustness [--config FILE] [--task NAME] [--seeds 3] [--first 0] [--target 0.9]
                                    [--within 60] [--every 5] [--pipeline] [overrides...]

Seed index s shifts every seed of the run by s: the model init (`model.tiny.seed`), the
trainer (`algorithm.seed`), sampling (`rollout.seed`), the prompt order
(`data.shuffle_seed`) and the SFT order (`sft.seed`); s = 0 is the config exactly as given.
`--task` trains on one of bench/unseen_tasks.py's files (written to a scratch folder, given
as `data.train_path`, evaluated on its default held-out split) instead of the config's data.
With `--pipeline` each seed runs `flows.pipeline` (SFT, then RL from its model) instead of
`flows.train`, and the report adds the pipeline's held-out accuracy after SFT and after RL
(its eval stages, `<run>/pipeline.json`); the target then applies to the one after RL. The runs go one at a time
(on 2 cores, side by side runs would slow each other and their wall times would mean
nothing). The flow's own output goes to stderr; stdout is the report: per seed the wall
time, the first iteration whose train reward reaches the target, the first evaluations at
which held-out accuracy reaches 0.8 and the target, the best held-out accuracy within
`--within` iterations, the lowest after that (a collapse shows there), the final reward (mean
of the last 3 iterations), the final eval accuracy (`eval_reward_mean` of the last eval),
a curve table every `--every` iterations (reward, entropy, share of prompt groups whose
rewards all agree), and min / median / max over the seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.unseen_tasks import TASKS, write_task
from infra.config import RunConfig
from infra.config_files import load_config
from infra.storage.fs import RunStore
from infra.storage.metrics import read_metrics


def seed_overrides(cfg: RunConfig, s: int) -> list[str]:
    """Overrides that shift every seed of `cfg` by `s` (0: unchanged)."""
    return [
        f"run_name={cfg.run_name}-seed{s}",
        f"model.tiny.seed={cfg.model.tiny.seed + s}",
        f"algorithm.seed={cfg.algorithm.seed + s}",
        f"rollout.seed={cfg.rollout.seed + s}",
        f"data.shuffle_seed={cfg.data.shuffle_seed + s}",
        f"sft.seed={cfg.sft.seed + s}",
        "checkpoint.resume=fresh",
    ]


def run_seed(
    config: str | None, overrides: list[str], module: str = "flows.train"
) -> tuple[float, list[dict]]:
    """Run the flow in a child process; its wall time and metrics rows."""
    cmd = [sys.executable, "-m", module, *(["--config", config] if config else []), *overrides]
    print("$", " ".join(cmd[1:]), flush=True)
    t0 = time.monotonic()
    rc = subprocess.run(cmd, stdout=sys.stderr, check=False).returncode
    wall = time.monotonic() - t0
    if rc:
        raise SystemExit(f"run failed with exit code {rc}: {' '.join(cmd)}")
    cfg = load_config(config, overrides)
    return wall, read_metrics(RunStore(cfg.storage, cfg.run_name))


def pipeline_evals(config: str | None, overrides: list[str]) -> dict:
    """The pipeline's held-out accuracy after SFT and after RL (its eval stages)."""
    cfg = load_config(config, overrides)
    summary = json.loads(RunStore(cfg.storage, cfg.run_name).read_text("pipeline.json"))
    return {"sft_eval": summary["eval_after_sft"], "pipeline_eval": summary["eval_after_rl"]}


def _first(pairs: list[tuple[int, float]], target: float) -> int | None:
    return next((k for k, v in pairs if v >= target), None)


def summarize(rows: list[dict], target: float, within: int = 60) -> dict:
    rewards = [r["reward_mean"] for r in rows]
    evals = [(r["rollout_id"], r["eval_reward_mean"]) for r in rows if "eval_reward_mean" in r]
    early = [v for k, v in evals if k < within]
    late = [v for k, v in evals if k >= within]
    return {
        "iterations": len(rows),
        "first_reward": rewards[0],
        "first_eval": evals[0] if evals else None,
        "reward_target_iter": _first([(r["rollout_id"], r["reward_mean"]) for r in rows], target),
        "eval_0.8_iter": _first(evals, 0.8),
        "eval_target_iter": _first(evals, target),
        "best_eval_within": max(early) if early else None,
        "min_eval_after": min(late) if late else None,
        "final_reward": statistics.fmean(rewards[-3:]),
        "final_eval": evals[-1][1] if evals else None,
        "final_eval_iter": evals[-1][0] if evals else None,
    }


def curve(rows: list[dict], every: int) -> list[str]:
    """Every `every`-th row and the last; the eval column is the latest eval so far (@ its iteration)."""
    lines = [" iter | reward | entropy | zero-var groups | stuck groups | latest eval acc"]
    latest = ""
    for r in rows:
        if "eval_reward_mean" in r:
            latest = f"{r['eval_reward_mean']:.3f} @{r['rollout_id']}"
        if r["rollout_id"] % every and r is not rows[-1]:
            continue
        lines.append(
            f" {r['rollout_id']:4d} | {r['reward_mean']:6.3f} | {r['entropy']:7.3f} | "
            f"{r['zero_variance_group_frac']:15.3f} | {r.get('stuck_group_frac', float('nan')):12.3f} | {latest}"
        )
    return lines


def _eval_span(res: dict) -> str:
    if res["first_eval"] is None:
        return "- (no eval)"
    (i0, e0), i1 = res["first_eval"], res["final_eval_iter"]
    return f"{e0:.3f} (iteration {i0}) -> {res['final_eval']:.3f} (iteration {i1})"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _run(args: argparse.Namespace, base: RunConfig, s: int) -> dict:
    """One seed: its run, the report's lines, and its results."""
    overrides = [*args.overrides, *seed_overrides(base, s)]
    module = "flows.pipeline" if args.pipeline else "flows.train"
    wall, rows = run_seed(args.config, overrides, module)
    res = {"seed": s, "wall_s": wall, **summarize(rows, args.target, args.within)}
    if args.pipeline:
        res.update(pipeline_evals(args.config, overrides))
    stages = (
        f"; pipeline held-out accuracy {res['sft_eval']:.3f} after SFT, {res['pipeline_eval']:.3f} after RL"
        if args.pipeline
        else ""
    )
    print(
        f"seed {s}: wall {wall:.1f} s, {res['iterations']} iterations, reward "
        f"{_fmt(res['first_reward'])} -> {_fmt(res['final_reward'])} (last 3), reward >= {args.target} "
        f"first at iteration {_fmt(res['reward_target_iter'])}, eval accuracy {_eval_span(res)}{stages}; "
        f"eval >= 0.8 first at iteration {_fmt(res['eval_0.8_iter'])}, >= {args.target} at "
        f"{_fmt(res['eval_target_iter'])}; best eval before iteration {args.within} "
        f"{_fmt(res['best_eval_within'])}, lowest from then on {_fmt(res['min_eval_after'])}"
    )
    print("\n".join(curve(rows, args.every)), flush=True)
    return res


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="YAML config (default: the embedded demo defaults)")
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds (first..first+N-1)")
    parser.add_argument("--first", type=int, default=0, help="first seed index")
    parser.add_argument("--target", type=float, default=0.9, help="reward and eval accuracy target")
    parser.add_argument("--within", type=int, default=60, help="iterations the target should be reached in")
    parser.add_argument("--task", choices=sorted(TASKS), help="train on this bench/unseen_tasks.py task")
    parser.add_argument("--every", type=int, default=5, help="curve table: every N iterations")
    parser.add_argument("--pipeline", action="store_true", help="run flows.pipeline (SFT, then RL)")
    parser.add_argument("overrides", nargs="*", help="key.path=value applied to every run")
    args = parser.parse_args(argv)
    if args.task:
        path = write_task(args.task, Path(tempfile.mkdtemp(prefix="unseen-tasks-")))
        args.overrides = [f"data.train_path={path}", f"run_name={args.task}", *args.overrides]
    base = load_config(args.config, args.overrides)
    mem = psutil.virtual_memory().total / 2**30
    print(
        f"machine: {os.cpu_count()} cores, {mem:.0f} GiB; config: {args.config or 'defaults'} {args.overrides}"
    )
    results = [_run(args, base, s) for s in range(args.first, args.first + args.seeds)]
    print(f"over {len(results)} seeds: min / median / max")
    keys = ["wall_s", "reward_target_iter", "eval_0.8_iter", "eval_target_iter", "best_eval_within"]
    keys += ["min_eval_after", "final_reward", "final_eval"]
    for key in keys + (["sft_eval", "pipeline_eval"] if args.pipeline else []):
        values = [r[key] for r in results if r[key] is not None]
        missing = len(results) - len(values)
        stats = (
            " / ".join(
                _fmt(v if key.endswith("_iter") else float(v))
                for v in (min(values), statistics.median(values), max(values))
            )
            if values
            else "-"
        )
        print(f"  {key}: {stats}" + (f" ({missing} seeds never reached it)" if missing else ""))
    final = "pipeline_eval" if args.pipeline else "final_eval"
    hit = sum(r[final] is not None and r[final] >= args.target for r in results)
    print(f"final eval accuracy >= {args.target}: {hit} of {len(results)} seeds")
    early = sum(r["eval_target_iter"] is not None and r["eval_target_iter"] < args.within for r in results)
    print(f"eval accuracy >= {args.target} before iteration {args.within}: {early} of {len(results)} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
