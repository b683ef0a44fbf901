"""rollout.over_sample_prompts: the first groups to come back make the batch and the stragglers
are aborted, on simulated engines (bench/sim_engine.py) whose response lengths come from the
samples' seeds, so which group holds the long response is known before the run."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest

from bench.sim_engine import SimSpec, serve
from infra.config import RunConfig, TinyModelConfig
from infra.data.prompts import PromptSource
from infra.engines.client import EngineClient, EngineError
from infra.engines.completions import Completion
from infra.engines.fleet import EngineFleet
from infra.model.tiny import build_tiny_model
from infra.rollout.manager import RolloutManager
from infra.rollout.over_sampling import first_groups
from tests.background_loop import background_loop

N = 4  # samples per prompt
# ~8 tokens a sample (0.04 s); 5% of samples 100x longer: with the default seed, group 2 of
# rollout 0 holds one of 755 tokens (3.8 s), the other groups' longest take 0.05 s
SPEC = SimSpec(
    median_tokens=8, sigma=0.1, tail_fraction=0.05, tail_factor=100, slots=64, slot_tokens_per_s=200
)
STRAGGLER = 2
STRAGGLER_S = 755 / SPEC.slot_tokens_per_s


@pytest.fixture(scope="module")
def urls():
    with background_loop() as loop:  # two engines, served while the module's tests run
        yield asyncio.run_coroutine_threadsafe(serve(SPEC, 2), loop).result(timeout=30)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("model"), TinyModelConfig())


def _config(tmp_path, **rollout) -> RunConfig:
    base = {
        "prompts_per_rollout": 4,
        "n_samples_per_prompt": N,
        "sampling": {"max_new_tokens": 2048},
        "dynamic_sampling": False,
    }
    return RunConfig.model_validate({"rollout": {**base, **rollout}, "storage": {"uri": str(tmp_path)}})


def _group_lengths(cfg: RunConfig, groups: int) -> list[int]:
    seed = cfg.rollout.seed * 2**40
    return [max(SPEC.length(seed + g * N + c) for c in range(N)) for g in range(groups)]


def test_the_straggling_group_is_aborted_and_the_batch_is_whole(urls, model, tmp_path):
    cfg = _config(tmp_path, over_sample_prompts=2)
    lengths = _group_lengths(cfg, 6)
    assert lengths[STRAGGLER] > 500 and max(lengths[:STRAGGLER] + lengths[STRAGGLER + 1 :]) < 20
    manager = RolloutManager(cfg, urls, str(model))
    drawn = manager.source.batch(0)
    assert len(drawn) == 6  # the prompt stream gives prompts_per_rollout + over_sample_prompts
    t0 = time.monotonic()
    summary = manager.generate(0)
    took = time.monotonic() - t0
    batch = manager.get_batch(0)
    assert took < STRAGGLER_S / 2
    assert len(batch.samples) == 16 and summary["num_samples"] == 16
    assert sorted({s.group for s in batch.samples}) == [0, 1, 2, 3]
    assert all(s.status != "aborted" for s in batch.samples)
    assert max(len(s.response_ids) for s in batch.samples) < 20  # none of the straggler's
    # the kept groups are prompts of the others, in prompt order
    others = iter(manager.formatter.text(row["prompt"]) for g, row in enumerate(drawn) if g != STRAGGLER)
    assert all(prompt in others for prompt in [batch.samples[i * N].prompt for i in range(4)])
    # the straggler was aborted in flight, and its tokens so far are counted as thrown away
    assert summary["over_sample_aborted_groups"] >= 1
    assert summary["over_sample_wasted_samples"] >= N
    assert summary["prompts_dropped"] == 0
    written = pd.read_parquet(summary["rollout_uri"])
    assert written.shape[0] == 16 and written["response_ids"].map(len).max() < 20


def test_without_over_sampling_the_straggler_holds_the_rollout(urls, model, tmp_path):
    cfg = _config(tmp_path)
    manager = RolloutManager(cfg, urls, str(model))
    t0 = time.monotonic()
    summary = manager.generate(0)
    assert time.monotonic() - t0 > _group_lengths(cfg, 4)[STRAGGLER] / SPEC.slot_tokens_per_s
    assert summary["num_samples"] == 16 and "over_sample_aborted_groups" not in summary


def test_the_abort_reaches_only_the_rollouts_requests(urls):
    """A request of someone else on the same engine (an eval) runs to its end."""
    long_seeds = [s for s in range(1000) if SPEC.length(s) > 500][:3]  # ~3 s each
    short_seeds = [s for s in range(1000) if SPEC.length(s) < 20]
    fleet = EngineFleet(urls, 30, 30, 0)
    other = EngineClient(urls[0])

    def request(client: EngineClient, g: int) -> list[Completion]:
        seeds = long_seeds[:2] if g == 1 else short_seeds[2 * g : 2 * g + 2]  # group 1 straggles
        params = [{"max_new_tokens": 2048, "sampling_seed": seed} for seed in seeds]
        return client.sample([[5]] * 2, params, rid=[f"t-{g}-{c}" for c in range(2)])

    with ThreadPoolExecutor(1) as pool:
        params = [{"max_new_tokens": 2048, "sampling_seed": long_seeds[2]}]
        eval_request = pool.submit(other.generate, [[5]], params, ["eval-0"])
        time.sleep(0.1)
        t0 = time.monotonic()
        kept, stats = first_groups(
            fleet, 4, 3, request, lambda g: [f"t-{g}-{c}" for c in range(2)], lambda g, outs: outs
        )
        took = time.monotonic() - t0
        [eval_out] = eval_request.result(timeout=30)
    assert sorted(kept) == [0, 2, 3] and stats["over_sample_aborted_groups"] == 1
    assert took < SPEC.length(long_seeds[0]) / SPEC.slot_tokens_per_s / 2
    assert eval_out["meta_info"]["finish_reason"]["type"] != "abort"
    assert eval_out["meta_info"]["completion_tokens"] == SPEC.length(long_seeds[2])


def test_an_engine_error_ends_the_rollout_with_it(urls):
    fleet = EngineFleet(urls, 30, 30, 0)
    long_seeds = [s for s in range(1000) if SPEC.length(s) > 500][:3]

    def request(client: EngineClient, g: int) -> list[Completion]:
        if g == 3:
            time.sleep(0.3)  # the others are running when it fails
            return client.sample([[5]], [{"n": 2}], rid=[f"bad-{g}"])
        params = [{"max_new_tokens": 2048, "sampling_seed": long_seeds[g]}]
        return client.sample([[5]], params, rid=[f"e-{g}"])

    t0 = time.monotonic()
    with pytest.raises(EngineError, match="HTTP 400"):
        first_groups(fleet, 4, 4, request, lambda g: [f"e-{g}"], lambda g, outs: outs)
    # the others were aborted, not waited for
    assert time.monotonic() - t0 < min(SPEC.length(s) for s in long_seeds) / SPEC.slot_tokens_per_s / 2


def test_an_iteration_spends_the_over_sampled_prompts_of_the_epoch(tmp_path):
    cfg = _config(tmp_path, over_sample_prompts=2)
    rows = [{"prompt": str(i), "label": ""} for i in range(12)]
    source = PromptSource(rows, cfg.rollout.prompts_drawn, 0)
    assert [len(source.batch(k)) for k in range(3)] == [6, 6, 6]
    assert source.ends_epoch(1) and source.epoch_of(2) == 1


def test_over_sampling_with_a_custom_rollout_is_refused():
    with pytest.raises(ValueError, match="rollout.over_sample_prompts with rollout.generate_fn"):
        RunConfig.model_validate({"rollout": {"over_sample_prompts": 2, "generate_fn": "m:f"}})
