"""Long-tailed responses: iteration time and staleness with and without over-sampling.

    python -m bench.long_tail [--points 8x2k,32x8k] [--over-sample 0,0.125,0.25] [--iterations 5]

Each run is a point of the scale sweep (bench/scale_point.py: the real flow, rollout manager
and storage against simulated engines, the trainer stand-in): response lengths lognormal
around 64 tokens with 1% of samples ten times longer, 16 samples per prompt, so about 15% of
prompt groups hold a long response, and the engines' speed set so that the plain rollout's
ideal generate time is `--target-s`. Per point it runs `rollout.over_sample_prompts` at each
share of `prompts_per_rollout` given, 0 first, and prints side by side: the iteration time
(start to start) and its ratio to the plain run's, the generate time, the kept samples'
staleness (rollout id minus the weight version that generated them: 1 is one step
off-policy), what over-sampling threw away per iteration (groups aborted in flight, groups
never sent, tokens generated then dropped) and the rollout manager's CPU per iteration (one
request per group instead of one per engine).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from bench.scale_point import GROUP, PointSpec, run_point
from bench.scale_sweep import _count, _label


def print_table(rows: list[dict]) -> None:
    print(
        "| engines | samples | over-sampled prompts | iteration s | vs plain | generate s | "
        "staleness mean / max | aborted groups/iter | unsent groups/iter | dropped tokens/iter | "
        "manager CPU s/iter |"
    )
    print("|" + "---|" * 11)
    plain = {(r["engines"], r["samples"]): r["iteration_s"] for r in rows if not r["over_sample"]}
    for r in rows:
        key = (r["engines"], r["samples"])
        o = r["over_sample_stats"]
        prompts = r["samples"] // GROUP
        print(
            f"| {r['engines']} | {_label(r['samples'])} | {r['over_sample']} ({r['over_sample'] / prompts:.1%}) | "
            f"{r['iteration_s']:.2f} | {r['iteration_s'] / plain[key] if key in plain else float('nan'):.3f} | "
            f"{r['generate_s']:.2f} | "
            f"{r['staleness_mean']:.2f} / {r['staleness_max']} | {o['over_sample_aborted_groups']:.1f} | "
            f"{o['over_sample_unsent_groups']:.1f} | {o['over_sample_wasted_tokens']:.0f} | "
            f"{r['cpu_s'].get('rollout manager', 0.0):.2f} |"
        )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.long_tail", description=__doc__.split("\n")[0])
    ap.add_argument("--points", default="8x2k,32x8k", help="ExS points, e.g. 32x8k")
    ap.add_argument("--over-sample", default="0,0.125,0.25", help="shares of prompts_per_rollout drawn extra")
    ap.add_argument("--iterations", type=int, default=5, help="per run; 1..iterations-2 are measured")
    ap.add_argument("--target-s", type=float, default=6.0, help="the plain rollout's ideal generate time")
    ap.add_argument("--keep", help="folder for the runs and their logs (default: a temporary one)")
    args = ap.parse_args(argv)
    shares = [float(x) for x in args.over_sample.split(",")]
    root = Path(args.keep or tempfile.mkdtemp(prefix="long-tail-"))
    rows = []
    for point in args.points.split(","):
        engines, samples = (int(point.split("x")[0]), _count(point.split("x")[1]))
        for share in shares:
            extra = round(share * samples // GROUP)
            spec = PointSpec(engines, samples, args.iterations, args.target_s, over_sample=extra)
            where = root / f"{engines}x{_label(samples)}-os{extra}"
            where.mkdir(parents=True, exist_ok=True)
            print(f"run {point}, {extra} prompts over-sampled ({where})", file=sys.stderr, flush=True)
            rows.append(run_point(spec, where, where / "flow.log"))
    print_table(rows)
    plain_of = {(p["engines"], p["samples"]): p for p in rows if not p["over_sample"]}
    for r in rows:  # the suite's RATIO lines (bench/suite.py), where the point ran plain too
        plain = plain_of.get((r["engines"], r["samples"]))
        if r["over_sample"] and plain is not None:
            print(
                f"RATIO iteration time, {r['over_sample']} prompts over-sampled / none, {r['engines']} engines x "
                f"{_label(r['samples'])} samples: {r['iteration_s'] / plain['iteration_s']:.2f}x (staleness "
                f"{r['staleness_mean']:.2f} against {plain['staleness_mean']:.2f}); goal < 1x, staleness unchanged"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
