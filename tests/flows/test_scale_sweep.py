"""bench.scale_sweep end to end on one tiny point: the real flow attached to simulated engines
(rollout.engine_urls) with the trainer stand-in (cluster.trainer_class)."""

from __future__ import annotations

import json

from bench import scale_sweep


def test_one_tiny_point_runs_the_flow_and_reports(tmp_path, capsys):
    png = tmp_path / "sweep.png"
    argv = ["--points", "2x256", "--iterations", "3", "--target-s", "1", "--png", str(png)]
    assert scale_sweep.main([*argv, "--keep", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if line.startswith("| 2 | 256 |")]
    assert float(row.split("|")[4]) > 0  # the physical limit, from the rollouts' real lengths
    assert "BOTTLENECK" in out and png.stat().st_size > 0
    [ratio] = [line for line in out.splitlines() if line.startswith("RATIO ")]
    assert "2 engines x 256 samples: " in ratio and "n=1)" in ratio  # iteration 1 is measured
    run = tmp_path / "runs" / "2x256" / "runs" / "scale"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [0, 1, 2]
    assert [r["weight_version"] for r in rows] == [0, 0, 1]  # async: one step behind
    # a fixed amount of work an iteration: one round, no dynamic sampling's draws again
    assert not any(k.startswith(("dynamic_sampling_", "over_sample_")) for r in rows for k in r)
    assert len(list((run / "rollouts").glob("*.parquet"))) == 3
    assert (run / "checkpoints" / "latest").exists()


def test_bench_long_tail_runs_the_flow_with_over_sampling(tmp_path, capsys):
    from bench import long_tail

    argv = ["--points", "2x256", "--over-sample", "0.25", "--iterations", "3", "--target-s", "1"]
    assert long_tail.main([*argv, "--keep", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if line.startswith("| 2 | 256 | 4 (25.0%) |")]
    assert float(row.split("|")[4]) > 0  # its iteration time
    assert "RATIO" not in out  # no plain run of the point to compare with
    rows = [json.loads(line) for line in (tmp_path / "2x256-os4" / "runs" / "scale" / "metrics.jsonl").open()]
    assert [r["num_samples"] for r in rows] == [256] * 3  # 16 groups of 16 kept of the 20 drawn
    for r in rows:  # every group drawn beyond the batch is accounted for
        assert r["over_sample_wasted_samples"] // 16 + r["over_sample_unsent_groups"] == 4
