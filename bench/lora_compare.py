"""Full fine-tuning against a LoRA adapter on the same model, task and seeds, side by side
in one run: what each trains and holds, the step time, and the bytes and time of a weight
sync per mode (full weights by broadcast; the adapter merged, by broadcast and by disk;
the adapter alone).

    python -m bench.lora_compare [--iterations 8] [overrides...]

The model is wider than the demo's (256 wide, 4 layers: `SHAPE`) so that an adapter is
small beside the weights it adapts, as on real models; 64 prompts x 16 samples, every group kept
(`bench.common.LOOP_SHAPE`). Each side is one flow run in a child
process, one after the other. Prints a table, then `RATIO` lines (LoRA / full).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import psutil

from bench.common import LOOP_SHAPE
from bench.seed_robustness import run_seed
from infra.config import RunConfig
from infra.config_files import load_config
from infra.storage.fs import RunStore

SHAPE = [
    "model.tiny.hidden_size=256",
    "model.tiny.num_layers=4",
    "model.tiny.intermediate_size=1024",
    "eval.interval=null",
    "checkpoint.save_interval=null",
    *LOOP_SHAPE,
]
LORA = [
    "model.lora.r=8",
    "model.lora.alpha=16",
    "model.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
]
SIDES = {
    "full, broadcast": [],
    "lora merged, broadcast": [*LORA, "weight_sync.lora=merged"],
    "lora merged, disk": [*LORA, "weight_sync.lora=merged", "weight_sync.method=disk"],
    "lora adapter": [*LORA, "weight_sync.lora=adapter"],
}


def trained_state(cfg: RunConfig) -> tuple[int, int]:
    """Trainable parameters of the policy and the bytes of its AdamW state (two fp32 moments)."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    from infra.model.lora import apply_lora
    from infra.model.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = AutoModelForCausalLM.from_pretrained(
            build_tiny_model(tmp, cfg.model.tiny), dtype=torch.float32
        )
    if cfg.model.lora is not None:
        model = apply_lora(model, cfg.model.lora)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, 2 * 4 * trainable


def _sync_bytes(cfg: RunConfig, rows: list[dict]) -> int:
    """What one sync moved: the broadcast's bytes, or the size of the last export on disk."""
    if "bytes" in rows[-1]:
        return int(rows[-1]["bytes"])
    store = RunStore(cfg.storage, cfg.run_name)
    folder = "adapters" if cfg.weight_sync.lora == "adapter" and cfg.model.lora else "weights"
    last = sorted(store.ls(folder))[-1].rstrip("/").rsplit("/", 1)[-1]
    fs, root = store.fs, store.uri(folder, last)
    return sum(
        fs.size(f) for f in fs.find(root) if not f.endswith(("tokenizer.json", "tokenizer_config.json"))
    )


def measure(side: str, overrides: list[str]) -> dict:
    cfg = load_config(None, overrides)
    wall, rows = run_seed(None, overrides)
    steady = rows[1:]  # the first iteration also waits for the first generate
    trainable, optim_bytes = trained_state(cfg)
    return {
        "side": side,
        "trainable": trainable,
        "optim_bytes": optim_bytes,
        "train_s": statistics.median(r["time_train_s"] for r in steady),
        "sync_s": statistics.median(r["time_sync_s"] for r in steady if "time_sync_s" in r),
        "sync_bytes": _sync_bytes(cfg, rows),
        "reward_last": rows[-1]["reward_mean"],
        "wall_s": wall,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("overrides", nargs="*", help="key.path=value applied to every side")
    args = parser.parse_args(argv)
    mem = psutil.virtual_memory().total / 2**30
    print(f"machine: {os.cpu_count()} cores, {mem:.0f} GiB; shape: {SHAPE}; overrides: {args.overrides}")
    results = []
    for i, (side, extra) in enumerate(SIDES.items()):
        common = [
            *SHAPE,
            f"num_rollout={args.iterations}",
            "checkpoint.resume=fresh",
            f"run_name=lora-compare-{i}",
        ]
        results.append(measure(side, [*common, *extra, *args.overrides]))
    print("| side | trainable params | AdamW state | train step (median) | sync (median) | sync bytes |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['side']} | {r['trainable']:,} | {r['optim_bytes'] / 2**20:.2f} MiB | {r['train_s']:.3f} s "
            f"| {r['sync_s']:.3f} s | {r['sync_bytes'] / 2**20:.3f} MiB |"
        )
    full = results[0]
    for r in results[1:]:
        print(
            f"RATIO {r['side']} / full: trainable {r['trainable'] / full['trainable']:.3f}x, "
            f"train step {r['train_s'] / full['train_s']:.2f}x, sync time {r['sync_s'] / full['sync_s']:.2f}x, "
            f"sync bytes {r['sync_bytes'] / full['sync_bytes']:.3f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
