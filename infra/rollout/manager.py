"""The rollout manager: owns the engines' clients, the prompt source and the rewards.

`generate(k)` turns prompts into a scored RolloutBatch that stays here until the trainer
ranks fetch it through Ray's object store; only a small summary travels back to Prefect.
Runs as a threaded Ray actor so that fetching batch k never waits behind generating k+1.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from infra.config import RunConfig
from infra.data.prompts import PromptSource, load_rows
from infra.data.rewards import resolve_reward
from infra.model.loading import localize
from infra.rollout.batch import RolloutBatch, Sample
from infra.rollout.client import EngineClient
from infra.rollout.dynamic_sampling import fill_with_signal
from infra.rollout.scoring import assign_advantages, pass_at_k, rollout_stats, score_samples
from infra.storage.fs import RunStore, storage_options
from infra.storage.rollouts import read_rollout, rollout_rel, write_rollout


def _plain(value):
    # parquet hands back numpy arrays and scalars; the trainer expects Python lists/numbers
    return value.tolist() if hasattr(value, "tolist") else value


def _split(path: str, split: str) -> str:
    # builtin tasks carry their own train/eval split; files are used as given
    if path.startswith("builtin:") and path.count(":") == 1:
        return f"{path}:{split}"
    return path


class RolloutManager:
    def __init__(self, cfg: RunConfig, engine_urls: list[str], model_uri: str):
        from transformers import AutoTokenizer

        self.cfg = cfg
        opts = storage_options(cfg.storage)
        self.store = RunStore(cfg.storage, cfg.run_name)
        self.tokenizer = AutoTokenizer.from_pretrained(localize(model_uri, opts))
        self.engines = [EngineClient(u, cfg.rollout.request_timeout_s) for u in engine_urls]
        data = cfg.data
        train_rows = load_rows(_split(data.train_path, "train"), data.prompt_key, data.label_key, opts)
        self.eval_rows = load_rows(_split(data.eval_path, "eval"), data.prompt_key, data.label_key, opts)
        self.source = PromptSource(train_rows, cfg.rollout.prompts_per_rollout, data.shuffle_seed)
        self.reward_fn = resolve_reward(data.reward)
        self.stop_ids = self._stop_token_ids(cfg.rollout.sampling.stop)
        self._batches: dict[int, RolloutBatch] = {}
        self._summaries: dict[int, dict] = {}
        self._lock = threading.Lock()

    def _stop_token_ids(self, stops: list[str]) -> list[int]:
        ids = []
        for s in stops:
            enc = self.tokenizer.encode(s, add_special_tokens=False)
            if len(enc) != 1:
                raise ValueError(
                    f"rollout.sampling.stop: {s!r} is {len(enc)} tokens; stop strings must be one token"
                )
            ids.append(enc[0])
        return ids

    # -- queries used by the flow's schedule -------------------------------------------
    def ends_epoch(self, rollout_id: int) -> bool:
        return self.source.ends_epoch(rollout_id)

    def prompt_state(self, next_rollout_id: int) -> dict:
        return self.source.state(next_rollout_id)

    # -- generation ----------------------------------------------------------------------
    def _sample(self, rows: list[dict], n: int, temperature: float, seed: int, rid: str) -> list[Sample]:
        """Send prompt groups to the engines (contiguous chunks, one request each, in parallel)."""
        s = self.cfg.rollout.sampling
        params = {
            "max_new_tokens": s.max_new_tokens,
            "temperature": temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "stop_token_ids": self.stop_ids,
            "n": n,
        }
        prompt_ids = [self.tokenizer.encode(r["prompt"], add_special_tokens=False) for r in rows]
        per_engine = -(-len(rows) // len(self.engines))
        chunks = [range(i, min(i + per_engine, len(rows))) for i in range(0, len(rows), per_engine)]

        def run(e: int) -> list[dict]:
            idx = chunks[e]
            return self.engines[e].generate(
                [prompt_ids[i] for i in idx], {**params, "sampling_seed": seed + e}, rid=f"{rid}-e{e}"
            )

        with ThreadPoolExecutor(len(chunks)) as pool:
            outs = [o for chunk_outs in pool.map(run, range(len(chunks))) for o in chunk_outs]
        samples = []
        for j, out in enumerate(outs):  # SGLang orders n>1 outputs input-major
            g = j // n
            meta = out["meta_info"]
            finish = (meta.get("finish_reason") or {}).get("type", "")
            samples.append(
                Sample(
                    prompt=rows[g]["prompt"],
                    label=rows[g]["label"],
                    response=self.tokenizer.decode(out["output_ids"], skip_special_tokens=True),
                    prompt_ids=prompt_ids[g],
                    response_ids=list(out["output_ids"]),
                    engine_logprobs=[float(t[0]) for t in meta["output_token_logprobs"]],
                    weight_version=int(meta["weight_version"]),
                    group=g,
                    status={"length": "truncated", "abort": "aborted"}.get(finish, "completed"),
                    finish_reason=finish,
                )
            )
        return samples

    def generate(self, rollout_id: int) -> dict:
        """Roll out iteration `rollout_id`; a repeat call (a task retry) returns the same batch."""
        with self._lock:
            if rollout_id in self._summaries:
                return self._summaries[rollout_id]
        t0 = time.monotonic()
        r = self.cfg.rollout
        seed = r.seed * 1_000_003 + rollout_id * 1009
        rows = self.source.batch(rollout_id)

        def draw(round_: int) -> list[Sample]:  # round 0 is the plain rollout
            suffix = f"-d{round_}" if round_ else ""
            out = self._sample(
                rows,
                r.n_samples_per_prompt,
                r.sampling.temperature,
                seed + 7919 * round_,
                f"r{rollout_id}{suffix}",
            )
            score_samples(out, self.reward_fn, normalize_std=False)  # advantages: below, per estimator
            return out

        extra: dict = {}
        if r.dynamic_sampling:
            samples, extra = fill_with_signal(draw, len(rows), r.dynamic_sampling_max_rounds)
        else:
            samples = draw(0)
        t_gen = time.monotonic() - t0
        assign_advantages(samples, self.cfg.algorithm)
        uri = write_rollout(self.store, rollout_id, samples)
        return self._keep(RolloutBatch(rollout_id, samples), t_gen, time.monotonic() - t0, uri, extra)

    def _keep(
        self, batch: RolloutBatch, t_gen: float, t_all: float, uri: str, extra: dict | None = None
    ) -> dict:
        summary = {
            "rollout_id": batch.rollout_id,
            **rollout_stats(batch.samples),
            "epoch": self.source.epoch_of(batch.rollout_id),
            "time_generate_s": t_gen,
            "time_rollout_s": t_all,
            "rollout_uri": uri,
            **(extra or {}),
        }
        with self._lock:
            self._batches[batch.rollout_id] = batch
            self._summaries[batch.rollout_id] = summary
        return summary

    def has_batch(self, rollout_id: int) -> bool:
        with self._lock:
            return rollout_id in self._batches

    def restore(self, prompt_state: dict, prefetched_rollout: int | None) -> None:
        """Resume: check the prompt order matches, and adopt the batch generated ahead."""
        self.source.check_state(prompt_state)
        if prefetched_rollout is not None:
            frame = read_rollout(self.store, prefetched_rollout)
            fields = Sample.__dataclass_fields__
            samples = [
                Sample(**{k: _plain(v) for k, v in row.items() if k in fields})
                for row in frame.to_dict("records")
            ]
            self._keep(
                RolloutBatch(prefetched_rollout, samples),
                0.0,
                0.0,
                self.store.uri(rollout_rel(prefetched_rollout)),
            )

    def get_batch(self, rollout_id: int) -> RolloutBatch:
        with self._lock:
            if rollout_id not in self._batches:
                raise KeyError(f"rollout {rollout_id} was not generated (have {sorted(self._batches)})")
            return self._batches[rollout_id]

    def release(self, rollout_id: int) -> None:
        with self._lock:
            self._batches.pop(rollout_id, None)

    # -- evaluation -----------------------------------------------------------------------
    def evaluate(self, rollout_id: int) -> dict:
        t0 = time.monotonic()
        e = self.cfg.eval
        rows = self.eval_rows[: e.num_prompts]
        samples = self._sample(
            rows, e.n_samples, e.temperature, self.cfg.rollout.seed + 7, f"eval{rollout_id}"
        )
        score_samples(samples, self.reward_fn, normalize_std=False)
        result = {"eval_reward_mean": rollout_stats(samples)["reward_mean"], "eval_num_samples": len(samples)}
        for k in e.pass_k:
            result[f"eval_pass@{k}"] = pass_at_k(samples, k)
        result["time_eval_s"] = time.monotonic() - t0
        result["examples"] = [
            {"prompt": s.prompt, "response": s.response, "label": s.label, "reward": s.reward}
            for s in samples[:: max(1, e.n_samples)][:5]
        ]
        return result
