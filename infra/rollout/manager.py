"""The rollout manager: owns the engines' clients, the prompt source and the rewards.

`generate(k)` turns prompts into a scored RolloutBatch that stays here until the trainer
ranks fetch it through Ray's object store; only a small summary travels back to Prefect.
Runs as a threaded Ray actor so that fetching batch k never waits behind generating k+1.

Inside Ray the batch goes into the object store as soon as it is made (`batch_ref`): its
serialization then overlaps the training before it, instead of running as the actor's
reply when that training has ended and the next one asks for it (the demo: about 10 ms
an iteration on the loop's critical path).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TypeVar

import ray

from infra.config import RunConfig
from infra.data.group_rewards import scope_of
from infra.data.prompts import PromptSource, load_rows, with_split
from infra.data.rewards import resolve_reward
from infra.data.splits import train_and_eval_rows
from infra.data.templating import PromptFormatter
from infra.engines.client import EngineClient
from infra.engines.completions import Completion
from infra.engines.fleet import EngineFleet
from infra.heap import freeze_startup_heap
from infra.model.loading import localize
from infra.model.tokenizer import decode_many, load_tokenizer
from infra.rollout.batch import RolloutBatch, Sample, renumbered, weight_version_of
from infra.rollout.custom import GroupRequest, Trajectory, resolve_generate_fn
from infra.rollout.dynamic_sampling import fill_with_signal, rewards_seen
from infra.rollout.eval_sets import EvalSet
from infra.rollout.handoff import Handoff
from infra.rollout.over_sampling import first_groups
from infra.rollout.rollout_files import read_rollout_with_stats, rollout_rel, write_rollout
from infra.rollout.scoring import (
    assign_advantages,
    check_failures,
    failed_share,
    pass_at_k,
    rollout_stats,
    score_samples,
)
from infra.storage.fs import RunStore, storage_options

# Summaries of the latest rollouts kept for a retried generate task (the flow is at most
# one rollout ahead of training); older ones go, or a long run keeps one dict per iteration.
KEEP_SUMMARIES = 4

T = TypeVar("T")


def _status(finish_reason: str) -> str:
    """A sample's status from its SGLang finish reason type."""
    return {"length": "truncated", "abort": "aborted"}.get(finish_reason, "completed")


def _request(
    client: EngineClient,
    prompt_ids: list[list[int]],
    idx: range,
    n: int,
    params: dict,
    seed: int,
    rid: str,
    adapter: tuple[str, int] | None,
) -> list[Completion]:
    """One /generate of samples `idx` (sample j: copy j % n of prompt j // n)."""
    outs = client.sample(
        [prompt_ids[j // n] for j in idx],
        [{**params, "sampling_seed": seed + j} for j in idx],
        rid=_rids(rid, idx),
        **({"lora_path": adapter[0]} if adapter else {}),
    )
    if adapter is not None:  # loading an adapter leaves the engine's own version as it was
        for out in outs:
            out.meta_info.weight_version = str(adapter[1])
    return outs


def _rids(rid: str, idx: range) -> list[str]:
    return [f"{rid}-{j:07d}" for j in idx]


def _plain(value):
    # parquet hands back numpy arrays and scalars; the trainer expects Python lists/numbers
    return value.tolist() if hasattr(value, "tolist") else value


class RolloutManager:
    def __init__(
        self,
        cfg: RunConfig,
        engine_urls: list[str],
        model_uri: str,
        engine_actors: list | None = None,
        transport=None,
    ):
        self.cfg = cfg
        opts = storage_options(cfg.storage)
        self.store = RunStore(cfg.storage, cfg.run_name)
        self.model_uri = model_uri
        self.tokenizer = load_tokenizer(localize(model_uri, opts))
        self.engines: EngineFleet | None = None
        if engine_urls:
            self.attach_engines(engine_urls, engine_actors, transport)
        data = cfg.data
        train_file = load_rows(with_split(data.train_path, "train"), data.prompt_key, data.label_key, opts)
        train_rows, eval_rows = train_and_eval_rows(cfg, train_file, opts)
        self.eval_sets = [EvalSet.of(d, data, opts, self.cfg.eval) for d in self.cfg.eval.datasets] or [
            EvalSet.default(eval_rows, data, self.cfg.eval)
        ]
        self.source = PromptSource(train_rows, cfg.rollout.prompts_drawn, data.shuffle_seed)
        self.reward_fn = resolve_reward(data.reward, data)
        self.stop_ids = self._stop_token_ids(cfg.rollout.sampling.stop)
        self.generate_fn = resolve_generate_fn(cfg.rollout.generate_fn) if cfg.rollout.generate_fn else None
        self.formatter = PromptFormatter(
            self.tokenizer,
            data.apply_chat_template,
            data.system_prompt,
            data.max_prompt_len,
            data.overlong_prompt,
        )
        self._batches: dict[int, RolloutBatch] = {}
        self._refs: dict[int, ray.ObjectRef] = {}  # the batches in Ray's object store
        self._summaries: dict[int, dict] = {}
        # dynamic sampling: the run's lowest and highest reward so far (what `stuck` resampling
        # counts as solved); a resume reads it from the batch generated ahead
        self._rewards_seen: tuple[float, float] | None = None
        self._lock = threading.Lock()
        self.handoff = Handoff(self._consumers)
        # weight_sync.lora=adapter: the adapter every request names, and its weight version
        self._adapter: tuple[str, int] | None = None

    def attach_engines(
        self, engine_urls: list[str], engine_actors: list | None = None, transport=None
    ) -> None:
        """The engines this manager generates on. Separate from the constructor so that a run
        can build the manager (tokenizer, prompts: seconds of imports and loading) while its
        engines start, and hand it their URLs once they answer."""
        r = self.cfg.rollout
        # with the engines' actors and the weight transport, a failed engine is recovered
        self.engines = EngineFleet(
            engine_urls,
            r.request_timeout_s,
            r.engine_health_timeout_s,
            r.engine_max_restarts,
            engine_actors,
            transport,
            (self.model_uri, storage_options(self.cfg.storage)),
        )
        freeze_startup_heap()  # the tokenizer, prompts and imports: alive for the whole run

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

    # -- what a checkpoint records ----------------------------------------------------
    def prompt_state(self, next_rollout_id: int) -> dict:
        return self.source.state(next_rollout_id)

    # -- generation ----------------------------------------------------------------------
    def _sample(
        self,
        rows: list[dict],
        n: int,
        temperature: float,
        seed: int,
        rid: str,
        reward_fn: Callable,
        max_new_tokens: int | None = None,
    ) -> list[Sample]:
        """Send prompt groups to the engines (contiguous chunks, one request each, in parallel);
        the samples, scored by `reward_fn`, in prompt order.

        Every sample is its own input with its own rid (`{rid}-{index}`), so /abort_request
        reaches exactly that sample, and its own sampling_seed (`seed + index`), so no two
        copies of a GRPO group share a seed (SGLang gives n>1 copies one seed, and fresh
        random rids). Samples of one prompt are consecutive inputs: SGLang's prefix cache
        shares their prompt.

        An engine's reply is decoded and scored as soon as it arrives, while the other engines
        still generate: after the last reply only its own share is left to do (at 32 engines x
        8k samples, the time from the last reply to the batch fell from 0.5-0.9 s to 0.3-0.5 s,
        measured: time on the loop's critical path).
        """
        params = self._sampling_params(temperature, max_new_tokens)
        timeout_s = self.cfg.data.reward_timeout_s
        if self.generate_fn is not None:
            samples = self._sample_custom(rows, n, params, seed, rid)
            score_samples(samples, reward_fn, None, timeout_s)
            return samples
        # a batch reward is one call over the whole rollout: it waits for the last reply
        per_reply = scope_of(reward_fn) != "batch"

        def finish(idx: range, outs: list[Completion]) -> list[Sample]:
            return self._scored(idx, outs, rows, n, reward_fn if per_reply else None)

        samples = self._generate_on_engines([r["prompt_ids"] for r in rows], n, params, seed, rid, finish)
        if not per_reply:
            score_samples(samples, reward_fn, None, timeout_s)
        return samples

    def _scored(
        self, idx: range, outs: list[Completion], rows: list[dict], n: int, reward_fn: Callable | None
    ) -> list[Sample]:
        """Replies for samples `idx` (sample j: copy j % n of prompt j // n, whole groups) as
        Samples, scored by `reward_fn` unless it is None."""
        texts = decode_many(self.tokenizer, [out.output_ids for out in outs])
        samples = [
            self._sample_of(out, text, rows[j // n], j // n)
            for j, out, text in zip(idx, outs, texts, strict=True)
        ]
        if reward_fn is not None:
            score_samples(samples, reward_fn, None, self.cfg.data.reward_timeout_s)
        return samples

    def _first_to_finish(
        self, rows: list[dict], seed: int, rid: str
    ) -> tuple[list[dict], list[Sample], dict]:
        """rollout.over_sample_prompts: the first `prompts_per_rollout` groups of `rows` to come
        back, scored and numbered in prompt order; the rows they sample, and the stats of
        over-sampling (infra/rollout/over_sampling.py)."""
        r = self.cfg.rollout
        n, keep = r.n_samples_per_prompt, min(r.prompts_per_rollout, len(rows))
        params = self._sampling_params(r.sampling.temperature, None)
        prompt_ids = [row["prompt_ids"] for row in rows]
        adapter = self._adapter
        per_reply = scope_of(self.reward_fn) != "batch"

        def of(g: int) -> range:  # group g's samples
            return range(g * n, (g + 1) * n)

        def request(client: EngineClient, g: int) -> list[Completion]:
            return _request(client, prompt_ids, of(g), n, params, seed, rid, adapter)

        def finish(g: int, outs: list[Completion]) -> list[Sample]:
            return self._scored(of(g), outs, rows, n, self.reward_fn if per_reply else None)

        kept, stats = first_groups(
            self.engines, len(rows), keep, request, lambda g: _rids(rid, of(g)), finish
        )
        order = sorted(kept)
        samples = renumbered([kept[g] for g in order])
        if not per_reply:
            score_samples(samples, self.reward_fn, None, self.cfg.data.reward_timeout_s)
        return [rows[g] for g in order], samples, stats

    def _sampling_params(self, temperature: float, max_new_tokens: int | None) -> dict:
        s = self.cfg.rollout.sampling
        return {
            "max_new_tokens": max_new_tokens or s.max_new_tokens,
            "temperature": temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "stop_token_ids": self.stop_ids,
        }

    def _generate_on_engines(
        self,
        prompt_ids: list[list[int]],
        n: int,
        params: dict,
        seed: int,
        rid: str,
        finish: Callable[[range, list[Completion]], list[T]],
    ) -> list[T]:
        """n samples of every prompt; each engine gets one request of whole groups, all at once.
        `finish(sample indices, replies)` runs on each engine's replies in this thread as they
        arrive (one at a time, so rewards never race each other for the GIL); its results in
        sample order."""
        total = len(prompt_ids) * n
        per_engine = -(-len(prompt_ids) // len(self.engines)) * n  # whole groups per engine
        chunks = [range(i, min(i + per_engine, total)) for i in range(0, total, per_engine)]

        adapter = self._adapter  # one adapter for the whole call, though a sync may follow it

        def run(e: int) -> list[Completion]:
            # a chunk whose engine fails is sent again whole, once the engine is recovered
            return self.engines.call(
                e, lambda client: _request(client, prompt_ids, chunks[e], n, params, seed, rid, adapter)
            )

        done: list[list[T]] = [[] for _ in chunks]
        with ThreadPoolExecutor(len(chunks)) as pool:
            futures = {pool.submit(run, e): e for e in range(len(chunks))}
            for future in as_completed(futures):
                e = futures[future]
                done[e] = finish(chunks[e], future.result())
        return [x for chunk in done for x in chunk]

    def _sample_of(self, out: Completion, response: str, row: dict, group: int) -> Sample:
        """An engine's /generate reply for one sample of `row` as a Sample (`response`: its
        output_ids decoded)."""
        finish = out.finish
        return Sample(
            prompt=row["prompt_text"],
            label=row["label"],
            response=response,
            prompt_ids=row["prompt_ids"],
            response_ids=out.output_ids,  # decoded for this sample alone: no copy to make
            engine_logprobs=out.logprobs,
            weight_version=weight_version_of(out.meta_info.weight_version),
            group=group,
            status=_status(finish),
            finish_reason=finish,
        )

    def _sample_custom(self, rows: list[dict], n: int, params: dict, seed: int, rid: str) -> list[Sample]:
        """rollout.generate_fn over each prompt group (groups spread over the engines)."""

        def group(g: int, client: EngineClient) -> list[Trajectory]:
            row, first = rows[g], g * n
            request = GroupRequest(
                prompt=row["prompt_text"],
                prompt_ids=row["prompt_ids"],
                label=row["label"],
                n=n,
                sampling_params=dict(params),
                seeds=[seed + first + i for i in range(n)],
                rids=[f"{rid}-{first + i:07d}" for i in range(n)],
                engine=client,
                tokenizer=self.tokenizer,
            )
            return list(self.generate_fn(request))

        def run(g: int) -> list[Trajectory]:
            # watched like single-turn requests: a group whose engine died runs again, whole,
            # with the same seeds, once the engine is back
            out = self.engines.call(g % len(self.engines), lambda client: group(g, client))
            if len(out) != n:
                raise ValueError(f"rollout.generate_fn returned {len(out)} trajectories for n={n}")
            for t in out:
                t.check()
            return out

        with ThreadPoolExecutor(min(16, len(rows))) as pool:
            groups = list(pool.map(run, range(len(rows))))
        texts = iter(decode_many(self.tokenizer, [t.response_ids for ts in groups for t in ts]))
        return [
            Sample(
                prompt=rows[g]["prompt_text"],
                label=rows[g]["label"],
                response=next(texts),
                prompt_ids=rows[g]["prompt_ids"],
                response_ids=list(t.response_ids),
                engine_logprobs=[float(x) for x in t.engine_logprobs],
                weight_version=weight_version_of(t.weight_version),
                group=g,
                status=_status(t.finish_reason),
                finish_reason=t.finish_reason,
                loss_mask=list(t.loss_mask),
            )
            for g, trajectories in enumerate(groups)
            for t in trajectories
        ]

    def _fit(self, rows: list[dict]) -> tuple[list[dict], int]:
        """Rows with their prompt ids and the text the model sees; prompts over
        data.max_prompt_len are dropped (and counted) or truncated, per data.overlong_prompt."""
        fitted = []
        for row in rows:
            ids = self.formatter.ids(row["prompt"])
            if ids is not None:
                fitted.append({**row, "prompt_ids": ids, "prompt_text": self.formatter.text(row["prompt"])})
        if not fitted:
            raise ValueError(
                f"data.max_prompt_len={self.cfg.data.max_prompt_len}: every prompt of the batch is longer"
            )
        return fitted, len(rows) - len(fitted)

    def generate(self, rollout_id: int) -> dict:
        """Roll out iteration `rollout_id`; a repeat call (a task retry) returns the same batch."""
        with self._lock:
            if rollout_id in self._summaries:
                return self._summaries[rollout_id]
        t0 = time.monotonic()
        recovered_before = len(self.engines.recoveries)
        r = self.cfg.rollout
        seed = r.seed * 2**40 + rollout_id * 2**20  # + sample index: distinct per sample
        rows, _ = self._fit(self.source.batch(rollout_id))  # prompts_dropped: counted in _keep
        d = self.cfg.data
        first, extra = None, {}
        if r.over_sample_prompts:  # round 0: the first groups to come back, the rest aborted
            rows, first, extra = self._first_to_finish(rows, seed, f"r{rollout_id}")

        def draw(round_: int, prompts: list[int]) -> list[Sample]:  # round 0 is the plain rollout
            suffix = f"-d{round_}" if round_ else ""
            if round_ == 0 and first is not None:
                drawn = first
            else:
                drawn = self._sample(
                    [rows[i] for i in prompts],
                    r.n_samples_per_prompt,
                    r.sampling.temperature,
                    seed + round_ * 2**16,  # 2**16 samples a round at most keep seeds distinct
                    f"r{rollout_id}{suffix}",
                    self.reward_fn,
                )
            if failed_share(drawn) > d.max_failed_fraction:
                # a failing reward fails every round alike (its samples all agree, so dynamic
                # sampling would draw them all again): stop at the first, its errors on file
                check_failures(drawn, d.max_failed_fraction, write_rollout(self.store, rollout_id, drawn))
            return drawn

        if r.dynamic_sampling:
            samples, filled = fill_with_signal(
                draw,
                len(rows),
                r.dynamic_sampling_max_rounds,
                r.dynamic_sampling_resample,
                self._rewards_seen,
            )
            extra.update(filled)
            self._rewards_seen = rewards_seen(extra)
        else:
            samples = draw(0, list(range(len(rows))))
        t_gen = time.monotonic() - t0
        assign_advantages(samples, self.cfg.algorithm)
        uri = write_rollout(self.store, rollout_id, samples, extra)
        check_failures(samples, d.max_failed_fraction, uri)  # after the write: the errors are in it
        extra["engine_restarts"] = len(self.engines.recoveries) - recovered_before
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
            # the same keys for a batch adopted on resume as for one generated here (a
            # resumed run's metrics rows equal a straight run's): restarts count this run's
            "prompts_dropped": self.cfg.rollout.prompts_per_rollout - len({s.group for s in batch.samples}),
            "engine_restarts": 0,
            **(extra or {}),  # dynamic sampling's stats; its reward_mean is its first round's
        }
        ref = ray.put(batch) if ray.is_initialized() else None  # outside Ray (tests): no store
        with self._lock:
            self._batches[batch.rollout_id] = batch
            if ref is not None:
                self._refs[batch.rollout_id] = ref
            self._summaries[batch.rollout_id] = summary
            for old in [k for k in self._summaries if k <= batch.rollout_id - KEEP_SUMMARIES]:
                del self._summaries[old]
        return summary

    def held(self) -> dict[str, int]:
        """How many rollouts' batches, summaries and object-store copies the manager holds
        (bounded over a run)."""
        with self._lock:
            return {
                "batches": len(self._batches),
                "summaries": len(self._summaries),
                "stored": len(self._refs),
            }

    def has_batch(self, rollout_id: int) -> bool:
        with self._lock:
            return rollout_id in self._batches

    def restore(self, prompt_state: dict, prefetched_rollout: int | None, last_trained: int = -1) -> None:
        """Resume: check the prompt order matches, and adopt the batch generated ahead. Without
        one (sync mode), the run's rewards so far come from the file of the last trained
        rollout, `last_trained`, where this run wrote it (a checkpoint of another run has none
        here, and dynamic sampling then starts them afresh)."""
        self.source.check_state(prompt_state)
        if prefetched_rollout is None:
            if last_trained >= 0 and self.store.exists(rollout_rel(last_trained)):
                _, stats = read_rollout_with_stats(self.store, last_trained)
                self._rewards_seen = rewards_seen(stats) or self._rewards_seen
        else:
            frame, stats = read_rollout_with_stats(self.store, prefetched_rollout)
            self._rewards_seen = rewards_seen(stats) or self._rewards_seen
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
                stats,
            )

    def get_batch(self, rollout_id: int) -> RolloutBatch:
        with self._lock:
            if rollout_id not in self._batches:
                raise KeyError(f"rollout {rollout_id} was not generated (have {sorted(self._batches)})")
            return self._batches[rollout_id]

    def batch_ref(self, rollout_id: int) -> ray.ObjectRef:
        """Batch `rollout_id` in the object store, as a ref to pass the ranks (the value a
        call of this method returns through Ray is that ref, not the batch). Inside Ray only."""
        self.get_batch(rollout_id)  # the same error as get_batch for a rollout never generated
        with self._lock:
            return self._refs[rollout_id]

    def _consumers(self, rollout_id: int) -> set[str]:
        """Who trains on this rollout: the actor (except critic-only iterations), the critic."""
        actor = {"actor"} if rollout_id >= self.cfg.num_critic_only_steps else set()
        return actor | ({"critic"} if self.cfg.critic.enabled else set())

    def release(self, rollout_id: int, consumer: str = "actor") -> None:
        if self.handoff.done(rollout_id, consumer):
            with self._lock:
                self._batches.pop(rollout_id, None)
                self._refs.pop(rollout_id, None)  # the object goes once the ranks are done with it

    # -- what the actor and the critic hand each other (ppo) ----------------------------
    def post(self, rollout_id: int, key: str, value: object) -> None:
        self.handoff.post(rollout_id, key, value)

    def wait_post(self, rollout_id: int, key: str) -> object:
        return self.handoff.wait(rollout_id, key, self.cfg.cluster.collective_timeout_s)

    # -- engines --------------------------------------------------------------------------
    def engine_urls(self) -> list[str]:
        """The engines' URLs now (an engine restarted after a failure serves at a new one)."""
        return list(self.engines.urls)

    def set_engine_memory(self, resident: bool) -> None:
        """Colocated mode: every engine frees (or takes back) its weights. From here, a Ray
        worker: it holds the run's engine key and the engines' current URLs."""
        for e in range(len(self.engines)):
            client = self.engines.client(e)
            if resident:
                client.resume_memory_occupation()
            else:
                client.release_memory_occupation()

    def use_adapter(self, name: str, version: int) -> str | None:
        """Name LoRA adapter `name` (weight version `version`, loaded on every engine) in every
        request from now on; returns the adapter named before it."""
        previous, self._adapter = self._adapter, (name, version)
        return previous[0] if previous else None

    def ensure_engines(self) -> int:
        """Recover engines that are down now (before a weight sync); returns how many."""
        return self.engines.ensure_healthy()

    # -- evaluation -----------------------------------------------------------------------
    def evaluate(self, rollout_id: int) -> dict:
        """Every eval set; the first set's metrics also under the plain `eval_*` keys."""
        t0 = time.monotonic()
        result: dict = {}
        for i, es in enumerate(self.eval_sets):
            rows, _ = self._fit(es.rows)
            samples = self._sample(
                rows,
                es.n_samples,
                es.temperature,
                self.cfg.rollout.seed * 2**40 + 2**39 + rollout_id * 2**20 + i * 2**16,
                f"eval{rollout_id}-{es.name}",
                es.reward_fn or self.reward_fn,
                es.max_new_tokens,
            )
            metrics = {"reward_mean": rollout_stats(samples)["reward_mean"], "num_samples": len(samples)}
            for k in self.cfg.eval.pass_k:
                metrics[f"pass@{k}"] = pass_at_k(samples, k)
            prefixes = ["eval_"] if es.name == "" else [f"eval_{es.name}_"] + (["eval_"] if i == 0 else [])
            for prefix in prefixes:
                result.update({f"{prefix}{key}": value for key, value in metrics.items()})
            if i == 0:
                result["examples"] = [
                    {"prompt": s.prompt, "response": s.response, "label": s.label, "reward": s.reward}
                    for s in samples[:: max(1, es.n_samples)][:5]
                ]
        result["time_eval_s"] = time.monotonic() - t0
        return result
