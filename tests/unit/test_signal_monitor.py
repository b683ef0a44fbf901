"""The stalled-learning warnings on metrics rows shaped like the measured runs."""

from infra.config import MonitorConfig
from infra.tracking.signal_monitor import SignalMonitor


def _rows(stuck: list[float], entropy: list[float]) -> list[dict]:
    return [{"stuck_group_frac": s, "entropy": e} for s, e in zip(stuck, entropy, strict=True)]


def _warnings(rows: list[dict], **cfg) -> list[tuple[int, str]]:
    monitor = SignalMonitor(MonitorConfig(**cfg))
    return [(k, w.split(":")[0]) for k, row in enumerate(rows) for w in monitor.observe(row)]


def test_a_learning_run_warns_of_nothing():
    # the demo's shape: most groups stuck at the random init, then learning, then solved
    # (flat at the best reward is not stuck) with the entropy near zero
    stuck = [0.87, 0.8, 0.7, 0.6, 0.55, 0.5, 0.3, 0.1, 0.05] + [0.0] * 20
    entropy = [4.6, 4.5, 4.4, 4.2, 4.0, 3.8, 3.0, 2.0, 1.0] + [0.03] * 20
    assert _warnings(_rows(stuck, entropy)) == []


def test_collapse_warns_once_while_it_lasts_and_again_after_it_cleared():
    # pick-digit at lr 5e-3: deterministic (entropy 0.05) while 40% of the prompts stay wrong
    stuck = [0.5, 0.3, 0.4, 0.4, 0.4, 0.0, 0.4]
    entropy = [4.0, 1.0, 0.05, 0.04, 0.05, 0.3, 0.02]
    assert _warnings(_rows(stuck, entropy)) == [(2, "entropy collapse"), (6, "entropy collapse")]


def test_no_signal_needs_patience_iterations_in_a_row():
    stuck = [0.9] * 4 + [0.2] + [0.9] * 6
    rows = _rows(stuck, [4.0] * len(stuck))
    assert _warnings(rows, patience=5) == [(9, "no learning signal")]
    assert _warnings(rows, patience=7) == []


def test_rows_without_the_metric_and_a_zero_floor_warn_of_nothing():
    assert _warnings([{}, {"entropy": 0.0}]) == []
    assert _warnings(_rows([0.9] * 3, [0.0] * 3), entropy_floor=0) == []
