"""Reading /generate answers in the rollout manager: generic JSON against typed completions.

    python -m bench.reply_decoding [--repeats 5]

Per shape, answers as an engine writes them (the simulated engine's replies, serialized with
orjson as SGLang's server does: `[logprob, token_id, null]` per token), read both ways,
alternating: generic is `orjson.loads` and the per-token logprob list the manager used to
build from it; typed is `infra/engines/completions.py` (what `EngineClient.sample` does).
Both end with each sample's output ids, logprobs and finish reason in hand. One core, no
network: the decoding alone, which the manager does for every sample of every iteration.
"""

from __future__ import annotations

import argparse
import time

import orjson

from bench.common import ratio_line, spread
from bench.sim_engine import SimEngine, SimSpec
from infra.engines.completions import decode_completions

# (samples, median response tokens): the demo's 1024 one-token samples, and the scale
# sweep's 8k samples of its long-tailed lengths (bench/scale_point.py)
SHAPES = [(1024, 1), (8192, 64)]
MAX_NEW_TOKENS = 4096


def answer(samples: int, median_tokens: float) -> bytes:
    spec = SimSpec(median_tokens=median_tokens, sigma=0.8 if median_tokens > 1 else 0.0)
    engine = SimEngine(spec, 0)
    sp = {"stop_token_ids": [2], "max_new_tokens": MAX_NEW_TOKENS}
    replies = []
    for seed in range(samples):
        n = min(spec.length(seed), MAX_NEW_TOKENS)
        replies.append(engine._reply(f"r-{seed}", 8, seed, n, n, False, sp))
    return orjson.dumps(replies)


def generic(body: bytes) -> list[tuple[list[int], list[float], str]]:
    out = []
    for reply in orjson.loads(body):
        meta = reply["meta_info"]
        finish = (meta.get("finish_reason") or {}).get("type", "")
        out.append((list(reply["output_ids"]), [float(t[0]) for t in meta["output_token_logprobs"]], finish))
    return out


def typed(body: bytes) -> list[tuple[list[int], list[float], str]]:
    return [(c.output_ids, c.logprobs, c.finish) for c in decode_completions(body)]


def _timed(fn, body: bytes) -> float:
    t0 = time.perf_counter()
    fn(body)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print("| samples | tokens | answer MiB | generic ms | typed ms | typed / generic |")
    print("|---|---|---|---|---|---|")
    ratios: dict[int, list[float]] = {}
    for samples, median in SHAPES:
        body = answer(samples, median)
        assert typed(body) == generic(body), "the two readings differ"
        tokens = sum(len(ids) for ids, _, _ in typed(body))
        times: dict[str, list[float]] = {"generic": [], "typed": []}
        for _ in range(args.repeats):
            for name, fn in (("generic", generic), ("typed", typed)):
                times[name].append(_timed(fn, body))
        ratios[samples] = [t / g for t, g in zip(times["typed"], times["generic"], strict=True)]
        print(
            f"| {samples} | {tokens} | {len(body) / 2**20:.1f} | {spread([1e3 * t for t in times['generic']], '{:.1f}')}"
            f" | {spread([1e3 * t for t in times['typed']], '{:.1f}')} | {spread(ratios[samples], '{:.2f}')} |"
        )
    for samples, median in SHAPES:
        name = f"typed / generic reading of {samples} samples' answers (median {median} tokens)"
        print(ratio_line(name, ratios[samples], "< 1x"))


if __name__ == "__main__":
    main()
