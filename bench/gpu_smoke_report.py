"""Print the figures of a gpu_smoke run: one line per iteration, from its metrics.jsonl.

python -m bench.gpu_smoke_report RUN_FOLDER
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = [
    ("rollout_id", "iter", "{:d}"),
    ("reward_mean", "reward", "{:.3f}"),
    ("time_generate_s", "generate_s", "{:.2f}"),
    ("time_train_s", "train_s", "{:.2f}"),
    ("time_sync_s", "sync_s", "{:.2f}"),
    ("weights_checked", "checked", "{:d}"),
    ("max_abs_diff", "max_abs_diff", "{:.3g}"),
    ("time_iteration_s", "iteration_s", "{:.2f}"),
]


def report(run_folder: str) -> int:
    path = Path(run_folder) / "metrics.jsonl"
    if not path.is_file():
        print(f"gpu_smoke: no metrics at {path}: the run did not complete an iteration")
        return 1
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print(" ".join(f"{title:>12}" for _, title, _ in COLUMNS))
    for row in rows:
        cells = [fmt.format(row[key]) if key in row else "-" for key, _, fmt in COLUMNS]
        print(" ".join(f"{cell:>12}" for cell in cells))
    ok = len(rows) >= 3
    print(f"gpu_smoke: {len(rows)} iteration(s) recorded; {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(report(sys.argv[1]))
