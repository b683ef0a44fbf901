"""Does the control plane hold at cluster scale? The real flow against simulated engines.

    python -m bench.scale_sweep [--engines 1,8,32,128] [--samples 1k,8k,32k] [--points 32x8k,...]
                                [--iterations 5] [--target-s 6] [--png scale_sweep.png]

The seams (no monkeypatching): `rollout.engine_urls` attaches the run to engine servers that
already run, here the simulated ones of bench/sim_engine.py (SGLang's routes, a response
length drawn per sample: lognormal, median 64 tokens, 1% ten times longer; `slots` sequences
decoded at once per engine at a fixed per-slot speed); `cluster.trainer_class` puts the
trainer stand-in of bench/sim_trainer.py in place of the FSDP2 ranks (it fetches each batch
as a rank does, then waits a set time per sample). Everything else is what a run uses: the
Prefect flow `flows.train` on the Ray task runner, its task runs, logs and artifacts, the
rollout manager, rewards, parquet rollouts and checkpoints in a local folder.

At every point the engines' speed is set so that the ideal generate time is `--target-s`
and the trainer's wait plus the sync so that they take 80% of it: the physical limit of an
iteration is then about the same at every point, and what grows is the control plane's
work (bench/scale_point.py defines the limit and the measurements). Per point it prints the
iteration time over that limit, the generate time beside its ideal and the sync's time beside
the simulated broadcast's (where the difference goes), CPU seconds per iteration by role (the simulated engines and
the trainer stand-in are not control plane), the manager's requests per second to the
engines, PSS by role and bytes written per iteration; then log-log slopes of control-plane
CPU against samples and engines, and the first bottleneck: the single process that comes
nearest to a whole core (its Python threads share one GIL). Points run one after another;
each starts its own Ray cluster, Prefect API server and engines.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

from bench.scale_point import CONTROL_PLANE, PointSpec, run_point

DEFAULT_POINTS = "1x1k,8x1k,32x1k,128x1k,8x8k,32x8k"  # ~10 minutes on 2 shared cores


def _count(text: str) -> int:
    return int(float(text[:-1]) * 1024) if text.endswith("k") else int(text)


def _label(samples: int) -> str:
    return f"{samples // 1024}k" if samples % 1024 == 0 else str(samples)


def control_cpu(p: dict) -> float:
    return sum(p["cpu_s"].get(r, 0.0) for r in CONTROL_PLANE)


def print_table(points: list[dict]) -> None:
    roles = [*CONTROL_PLANE, "trainer stand-in", "simulated engines"]
    print(
        "| engines | samples | iteration s | limit s | iteration / limit | generate s | ideal generate s | "
        f"sync s (simulated {points[0]['sync_s']:g}) | "
        "control plane CPU s/iter | "
        + " | ".join(f"{r} CPU s" for r in roles)
        + " | control-plane CPU ms/sample | manager req/s (generate, health) | PSS MiB (manager, driver, "
        "prefect, task workers, ray system, engines) | written MiB/iter (run folder, all processes) |"
    )
    print("|" + "---|" * (13 + len(roles)))
    for p in points:
        cpu, req, mem, wr = p["cpu_s"], p["requests_per_s"], p["memory"], p["written_bytes"]
        mem_cells = ", ".join(
            f"{mem.get(r, 0) / 2**20:.0f}"
            for r in ["rollout manager", "flow driver", "prefect server", "ray task workers", "ray system"]
        )
        print(
            f"| {p['engines']} | {_label(p['samples'])} | {p['iteration_s']:.2f} | {p['limit_s']:.2f} | "
            f"{p['iteration_s'] / p['limit_s']:.3f} | {p['generate_s']:.2f} | {p['ideal_generate_s']:.2f} | "
            f"{p['sync_measured_s']:.2f} | {control_cpu(p):.2f} | "
            + " | ".join(f"{cpu.get(r, 0.0):.2f}" for r in roles)
            + f" | {control_cpu(p) / p['samples'] * 1000:.3f} | "
            f"{req.get('/generate', 0):.1f}, {req.get('/health', 0):.1f} | {mem_cells}, "
            f"{mem.get('simulated engines', 0) / 2**20:.0f} | "
            f"{p['run_dir_bytes'] / 2**20:.1f}, {sum(wr.values()) / 2**20:.1f} |"
        )


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log(y) on log(x); None with fewer than two distinct x."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def print_fits(points: list[dict]) -> None:
    measures = {
        "control-plane CPU s/iter": control_cpu,
        "rollout manager CPU s/iter": lambda p: p["cpu_s"].get("rollout manager", 0.0),
        "overhead s/iter (iteration - limit)": lambda p: max(p["iteration_s"] - p["limit_s"], 1e-3),
        "manager PSS": lambda p: p["memory"].get("rollout manager", 0),
    }
    for name, f in measures.items():
        for axis, other in (("samples", "engines"), ("engines", "samples")):
            for fixed in sorted({p[other] for p in points}):
                row = [p for p in points if p[other] == fixed]
                s = slope([p[axis] for p in row], [f(p) for p in row])
                if s is not None:
                    print(
                        f"FIT {name} ~ {axis}^{s:.2f} at {other}={fixed if other == 'engines' else _label(fixed)}"
                    )


def headline(points: list[dict]) -> None:
    """The suite's RATIO line (bench/suite.py): iteration time over the physical limit at the
    largest point, over its measured iterations."""
    p = max(points, key=lambda q: (q["samples"] * q["engines"], q["samples"]))
    r = sorted(p["ratios"])
    print(
        f"RATIO iteration time / physical limit, {p['engines']} engines x {_label(p['samples'])} samples: "
        f"{r[len(r) // 2]:.2f}x (min {r[0]:.2f}x, max {r[-1]:.2f}x, n={len(r)}); goal <= 1.02x"
    )


def bottleneck(points: list[dict]) -> None:
    """The process role nearest a whole core at the largest point (single processes: the
    manager, the driver, the API server serialise on their GIL)."""
    p = max(points, key=lambda q: (q["samples"] * q["engines"], q["samples"]))
    singles = ["rollout manager", "flow driver", "prefect server"]
    busy = {r: p["cpu_s"].get(r, 0.0) / p["wall_s"] for r in singles}
    top = max(busy, key=busy.get)
    overhead = p["iteration_s"] / p["limit_s"] - 1
    print(
        f"BOTTLENECK at {p['engines']} engines x {_label(p['samples'])}: {top} busy {busy[top]:.0%} of a core "
        f"over the iteration ({', '.join(f'{r} {b:.0%}' for r, b in busy.items())}); "
        f"iteration {overhead:+.1%} over the physical limit"
    )


def plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, axis, other in ((axes[0], "engines", "samples"), (axes[1], "samples", "engines")):
        for fixed in sorted({p[other] for p in points}):
            row = sorted((p for p in points if p[other] == fixed), key=lambda p: p[axis])
            label = f"{_label(fixed)} samples" if other == "samples" else f"{fixed} engines"
            ax.plot([p[axis] for p in row], [p["iteration_s"] / p["limit_s"] for p in row], "o-", label=label)
        ax.set_xscale("log", base=2)
        ax.axhline(1.02, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel(f"{axis} (log scale)")
        ax.set_ylabel("iteration time / physical limit")
        ax.legend()
    fig.suptitle("Control plane at scale: the real flow and manager against simulated engines")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale_sweep", description=__doc__.split("\n")[0])
    ap.add_argument("--engines", help="engine counts, e.g. 1,8,32,128 (with --samples: their grid)")
    ap.add_argument("--samples", help="samples per iteration, e.g. 1k,8k,32k")
    ap.add_argument("--points", default=DEFAULT_POINTS, help="ExS points, e.g. 32x8k (used without the grid)")
    ap.add_argument("--iterations", type=int, default=5, help="per point; 1..iterations-2 are measured")
    ap.add_argument("--target-s", type=float, default=6.0, help="ideal generate time the engines are set for")
    ap.add_argument("--png", default="scale_sweep.png")
    ap.add_argument("--keep", help="folder for the runs and their logs (default: a temporary one)")
    args = ap.parse_args(argv)
    if args.engines or args.samples:
        grid = [(e, s) for s in (args.samples or "1k").split(",") for e in (args.engines or "32").split(",")]
    else:
        grid = [tuple(p.split("x")) for p in args.points.split(",")]
    specs = [PointSpec(int(e), _count(s), args.iterations, args.target_s) for e, s in grid]
    root = Path(args.keep or tempfile.mkdtemp(prefix="scale-sweep-"))
    points = []
    for spec in specs:
        where = root / f"{spec.engines}x{_label(spec.samples)}"
        where.mkdir(parents=True, exist_ok=True)
        print(
            f"point {spec.engines} engines x {_label(spec.samples)} samples ({where})",
            file=sys.stderr,
            flush=True,
        )
        try:
            points.append(run_point(spec, where, where / "flow.log"))
        except Exception as e:  # noqa: BLE001 - a point that does not fit is reported, the rest run
            print(f"POINT FAILED {spec.engines}x{_label(spec.samples)}: {e}", flush=True)
    if not points:
        return 1
    print_table(points)
    print_fits(points)
    bottleneck(points)
    headline(points)
    plot(points, Path(args.png))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
