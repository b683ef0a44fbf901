"""Real FSDP2 on 2 gloo ranks (spawned processes) with the tiny model."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from infra.config import AlgorithmConfig, RunConfig
from infra.rollout.batch import RolloutBatch, Sample
from infra.weights.group import broadcast, close_update_group, open_update_group
from tests.dist.rank_state import full_train_state
from tests.dist.ranks import spawn_ranks
from tests.ports import free_port

pytestmark = pytest.mark.dist
ADDR = "127.0.0.1"


def _cfg(**algorithm) -> RunConfig:
    return RunConfig(
        rollout={"prompts_per_rollout": 2, "n_samples_per_prompt": 4, "sampling": {"temperature": 0.7}},
        algorithm={"micro_batch_size": 2, **algorithm},
        cluster={"trainer": {"num_workers": 2}},
        weight_sync={"bucket_size_mb": 0.05},  # the tiny model then needs several buckets
    )


def _batch(seed: int, n: int = 8) -> RolloutBatch:
    g = random.Random(seed)
    samples = []
    for i in range(n):
        response = [] if i == 5 else [g.randrange(4, 100) for _ in range(g.randint(1, 6))]
        samples.append(
            Sample(
                prompt="", label="", response="",
                prompt_ids=[g.randrange(4, 100) for _ in range(g.randint(3, 8))],
                response_ids=response,
                engine_logprobs=[-4.0] * len(response),
                weight_version=0, group=i // 4,
                status="failed" if i == 6 else "completed",
                advantage=g.uniform(-1.5, 1.5),
            )
        )  # fmt: skip
    return RolloutBatch(rollout_id=seed, samples=samples)


def _spawn(fn, nprocs: int, *args) -> None:
    spawn_ranks(fn, *args, nprocs=nprocs)


def _full_params(model) -> dict[str, torch.Tensor]:
    return {n: p.full_tensor().clone() for n, p in model.named_parameters()}


# --- (a) training step + full state dict, (c) DCP round trip ------------------------------


def _train_save_worker(rank: int, port: int, model_dir: str, out: str) -> None:
    from infra.trainer.rank import TrainerRank

    torch.set_num_threads(1)
    trainer = TrainerRank(_cfg(), rank, 2)
    trainer.setup(model_dir, {}, ADDR, port)
    before = _full_params(trainer.model)
    metrics = trainer.train(0, _batch(0))
    torch.save(
        {"before": before, "after": _full_params(trainer.model), "metrics": metrics}, f"{out}/a{rank}.pt"
    )
    full = trainer.full_state_dict()
    trainer.save_checkpoint(f"{out}/ckpt_local", {})
    trainer.save_checkpoint(f"file://{out}/ckpt_fsspec", {"auto_mkdir": True})
    saved = full_train_state(trainer)
    # in the background: staged now, written while the next step changes the weights
    trainer.save_checkpoint(f"{out}/ckpt_background", {}, background=True)
    metrics_next = trainer.train(1, _batch(1))
    # what RunHandles.train reads to ask for the commit: only a step after a background save
    assert metrics["checkpoint_writing"] is False and metrics_next["checkpoint_writing"] is True
    written = trainer.finish_checkpoint()
    assert written == f"{out}/ckpt_background" and trainer.finish_checkpoint() is None
    state = {"full": full, "saved": saved, "next": full_train_state(trainer), "metrics_next": metrics_next}
    if rank == 0:  # full state dicts are gathered by all ranks but held by rank 0 only
        torch.save(state, f"{out}/c_save.pt")
    trainer.shutdown()


def _load_worker(rank: int, port: int, model_dir: str, out: str) -> None:
    from infra.trainer.rank import TrainerRank

    torch.set_num_threads(1)
    trainer = TrainerRank(_cfg(), rank, 2)
    trainer.setup(model_dir, {}, ADDR, port)
    trainer.load_checkpoint(f"{out}/ckpt_local", {})
    loaded_local = full_train_state(trainer)
    trainer.load_checkpoint(f"{out}/ckpt_background", {})
    loaded_background = full_train_state(trainer)
    trainer.load_checkpoint(f"file://{out}/ckpt_fsspec", {})
    loaded = full_train_state(trainer)
    metrics_next = trainer.train(1, _batch(1))
    state = {
        "loaded_local": loaded_local,
        "loaded_background": loaded_background,
        "loaded": loaded,
        "next": full_train_state(trainer),
    }
    if rank == 0:
        torch.save({**state, "metrics_next": metrics_next}, f"{out}/c_load.pt")
    trainer.shutdown()


def _adamw_worker(rank: int, port: int, model_dir: str, out: str) -> None:
    from transformers import AutoModelForCausalLM

    from infra.trainer.parallelize import init_distributed, parallelize

    torch.set_num_threads(1)
    init_distributed(rank, 2, ADDR, port)
    params = {}
    for foreach in (False, True):
        model = parallelize(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), 2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.99), foreach=foreach)
        ids = torch.arange(24).reshape(4, 6) % 7 + rank  # each rank its own rows
        for _ in range(3):
            model(input_ids=ids).logits.square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        params[foreach] = _full_params(model)
    torch.save(params, f"{out}/adamw{rank}.pt")


def test_adamw_updates_fsdp2_shards_the_same_with_foreach(model_dir, tmp_path):
    # the ranks' AdamW runs foreach (fsdp_rank.py), where PyTorch's CPU default is its
    # per-parameter loop: three steps on sharded DTensors must end on the same weights
    _spawn(_adamw_worker, 2, free_port(), str(model_dir), str(tmp_path))
    for rank in range(2):
        got = torch.load(tmp_path / f"adamw{rank}.pt")
        for name, tensor in got[False].items():
            assert not torch.equal(tensor, got[True][name] * 0), name  # trained, not zero
            assert torch.equal(got[True][name], tensor), name


@pytest.fixture(scope="module")
def trained(model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trained")
    _spawn(_train_save_worker, 2, free_port(), str(model_dir), str(out))
    return out


def test_train_step_changes_weights_and_full_state_dict_is_exact(trained, model_dir):
    from transformers import AutoModelForCausalLM

    r0, r1 = torch.load(trained / "a0.pt"), torch.load(trained / "a1.pt")
    untimed = [{k: v for k, v in r["metrics"].items() if not k.startswith("time_")} for r in (r0, r1)]
    assert untimed[0] == untimed[1] and "time_batch_wait_s" in r0["metrics"]  # timings are each rank's own
    assert r0["metrics"]["num_steps"] == 1 and r0["metrics"]["response_tokens"] > 0
    assert r0["metrics"]["grad_norm"] > 0 and r0["metrics"]["train_engine_logprob_abs_diff"] > 0
    assert all(not torch.equal(r0["before"][n], r0["after"][n]) for n in r0["after"])
    assert all(torch.equal(r0["after"][n], r1["after"][n]) for n in r0["after"])  # both ranks' view

    full = torch.load(trained / "c_save.pt")["full"]
    assert full.keys() == r0["after"].keys()
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    plain.load_state_dict(full)
    for name, tensor in plain.state_dict().items():
        assert torch.equal(tensor, r0["after"][name]), name


def _assert_equal_tree(a, b, path="") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _assert_equal_tree(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    else:
        assert a == b, path


def test_dcp_round_trip_is_bitwise(trained, model_dir):
    _spawn(_load_worker, 2, free_port(), str(model_dir), str(trained))
    saved, loaded = torch.load(trained / "c_save.pt"), torch.load(trained / "c_load.pt")
    assert saved["saved"]["optim"]["state"], "the optimizer state must not be empty"
    _assert_equal_tree(saved["saved"], loaded["loaded_local"])
    _assert_equal_tree(saved["saved"], loaded["loaded"])
    # the background save holds the state of its call, not the step that ran during its write
    _assert_equal_tree(saved["saved"], loaded["loaded_background"])
    # training on from the checkpoint continues exactly as without the restart
    _assert_equal_tree(saved["next"], loaded["next"])
    assert saved["metrics_next"]["loss"] == loaded["metrics_next"]["loss"]


# --- (b) 2 ranks x micro-batches == one process on the whole batch -------------------------

ALG = {"kl_coef": 0.1, "entropy_coef": 0.01, "grad_clip": 0.5, "eps_clip": 0.1, "eps_clip_high": 0.15}
# Loss options whose aggregation spans sequences, epochs and TIS weights: still split-invariant.
VARIANTS = {
    "default": {},
    "seq-sum-norm-tis-epochs": {"loss_agg_mode": "seq-mean-token-sum-norm", "ppo_epochs": 2, "tis": "on"},
    "gspo-k2": {"advantage_estimator": "gspo", "kl_type": "k2", "eps_clip": 0.02, "eps_clip_high": 0.03},
    # the ranks pack micro-batches by a token budget (rows of 3-14 tokens: 1-2 rows each),
    # the one process compares with micro_batch_size=4: same loss, gradients and metrics
    "token-budget-seq-mean": {"micro_batch_tokens": 20, "loss_agg_mode": "seq-mean-token-mean"},
}


def _sgd_run(
    model_dir: str,
    world_size: int,
    rank: int,
    micro_batch_size: int,
    variant: str = "default",
    gather: str = "per_step",
) -> tuple[dict, dict]:
    """Two optimizer steps of plain SGD, so the weight change is the (clipped) gradient itself."""
    from transformers import AutoModelForCausalLM

    from infra.trainer.parallelize import parallelize
    from infra.trainer.step import train_on_batch

    def load(trainable: bool):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).requires_grad_(trainable)
        return parallelize(model, world_size, gather) if world_size > 1 else model

    model, ref = load(True), load(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    alg = {**ALG, **VARIANTS[variant]}
    if world_size == 1:
        alg.pop("micro_batch_tokens", None)  # the reference is the sample-count path
    metrics = train_on_batch(
        model, optimizer, scheduler, _batch(0).samples,
        rank=rank, world_size=world_size, cfg=AlgorithmConfig(micro_batch_size=micro_batch_size, **alg),
        global_batch_size=4, temperature=0.7, ref_model=ref, tis=alg.get("tis") == "on", max_response_len=6,
    )  # fmt: skip
    params = _full_params(model) if world_size > 1 else {n: p.detach() for n, p in model.named_parameters()}
    return metrics, params


def _sgd_worker(rank: int, port: int, model_dir: str, out: str, variant: str, gather: str) -> None:
    from infra.trainer.parallelize import init_distributed

    torch.set_num_threads(1)
    init_distributed(rank, 2, ADDR, port)
    metrics, params = _sgd_run(model_dir, 2, rank, micro_batch_size=1, variant=variant, gather=gather)
    torch.save({"metrics": metrics, "params": params}, f"{out}/b{rank}.pt")


# cluster.fsdp_gather: every variant with the weights gathered once per step (the default),
# and FSDP2's own per-micro-batch gathers on the default loss
@pytest.mark.parametrize(
    "variant,gather", [(v, "per_step") for v in VARIANTS] + [("default", "per_micro_batch")]
)
def test_two_ranks_with_micro_batches_match_one_process(model_dir, tmp_path, variant, gather):
    _spawn(_sgd_worker, 2, free_port(), str(model_dir), str(tmp_path), variant, gather)
    torch.set_num_threads(1)
    ref_metrics, ref_params = _sgd_run(str(model_dir), 1, 0, micro_batch_size=4, variant=variant)
    keys = ["loss", "pg_clipfrac", "kl", "entropy", "grad_norm", "train_engine_logprob_abs_diff"]
    if variant == "seq-sum-norm-tis-epochs":
        keys += ["tis_weight_mean", "tis_weight_max", "tis_capped_frac"]
    for rank in range(2):
        got = torch.load(tmp_path / f"b{rank}.pt")
        assert got["metrics"]["num_steps"] == 2 * VARIANTS[variant].get("ppo_epochs", 1)
        for key in keys:
            assert got["metrics"][key] == pytest.approx(ref_metrics[key], abs=1e-5), key
        assert got["metrics"]["response_tokens"] == ref_metrics["response_tokens"]
        assert ref_metrics["grad_norm"] > ALG["grad_clip"]  # clipping was active: the norm must be global
        assert ref_metrics["kl"] > 0
        for name, tensor in ref_params.items():
            torch.testing.assert_close(got["params"][name], tensor, atol=1e-5, rtol=0, msg=name)


# --- (d) weight sync: bucketed full_tensor gathers broadcast from trainer rank 0 -----------


class _QueueEngine:
    """Stands in for EngineClient in the trainer process: hands each request to the in-test
    receiver by a queue; the tensors then travel by the real broadcasts of update_weights.
    It answers like an SGLang 0.5.16 server: fp32 weights, no update session (404). The
    sync's calls go out through `EngineLanes.call` (the request bodies the trainer sends),
    which `_sync_worker` points at `answer`."""

    queue = None

    def __init__(self, url: str, timeout_s: float = 600) -> None:
        self.url = url

    def server_info(self) -> dict:
        return {"dtype": "float32", "tp_size": 1}

    def init_weights_update_group(
        self, master_address, master_port, rank_offset, world_size, group_name, backend
    ):
        self.queue.put(("init", master_address, master_port, rank_offset, world_size, group_name, backend))

    def destroy_weights_update_group(self, group_name) -> None:
        self.queue.put(("destroy", group_name))

    def answer(self, method: str, path: str, body: dict) -> tuple[dict, dict]:
        from infra.engines.client import EngineError

        assert method == "POST", (method, path)
        if path == "/pause_generation":
            assert body == {"mode": "retract"}, body  # running requests requeued, never aborted
        elif path == "/begin_weight_update":
            raise EngineError("queue://engine/begin_weight_update: HTTP 404: Not Found", 404)
        elif path == "/update_weights_from_distributed":
            keys = ("names", "dtypes", "shapes", "flush_cache", "weight_version", "load_format")
            self.queue.put(("update", *(body.get(k) for k in keys)))
        elif path != "/continue_generation":
            raise AssertionError(f"unexpected request {path}")
        return {}, {}


def _receiver(queue, out: str) -> None:
    _, addr, port, rank, world_size, group_name, backend = queue.get(timeout=120)
    group = open_update_group(addr, port, rank, world_size, group_name=group_name, backend=backend)
    received, requests = {}, []
    while (msg := queue.get(timeout=120))[0] == "update":
        _, names, dtypes, shapes, flush_cache, version, load_format = msg
        requests.append(
            {
                "names": names,
                "flush_cache": flush_cache,
                "weight_version": version,
                "load_format": load_format,
            }
        )
        parsed = [
            (name, getattr(torch, dtype), torch.Size(shape))
            for name, dtype, shape in zip(names, dtypes, shapes, strict=True)
        ]
        if load_format == "flattened_bucket":  # one byte buffer, the tensors back to back
            flat = torch.empty(sum(s.numel() * d.itemsize for _, d, s in parsed), dtype=torch.uint8)
            broadcast(group, flat, src=0)
            offset = 0
            for name, dtype, shape in parsed:
                n = shape.numel() * dtype.itemsize
                received[name] = flat[offset : offset + n].view(dtype).view(shape)
                offset += n
        else:
            for name, dtype, shape in parsed:
                received[name] = torch.empty(shape, dtype=dtype)
                broadcast(group, received[name], src=0)
    close_update_group(group)
    torch.save({"received": received, "requests": requests, "last": msg, "rank": rank}, f"{out}/d_recv.pt")


def _sync_worker(index: int, port: int, model_dir: str, out: str, queue) -> None:
    torch.set_num_threads(1)
    if index == 2:  # the third process plays the engine
        return _receiver(queue, out)
    import infra.weights.engines as engines_module
    from infra.engines.lanes import EngineLanes
    from infra.trainer.rank import TrainerRank

    _QueueEngine.queue = queue
    engines_module.EngineClient = _QueueEngine

    async def answer(self, client, method, path, body=None):
        return client.answer(method, path, body)

    EngineLanes.call = answer
    trainer = TrainerRank(_cfg(), index, 2)
    trainer.setup(model_dir, {}, ADDR, port)
    trainer.train(0, _batch(0))
    trainer.connect_engines(["queue://engine"])
    trainer.open_weight_group("sync")
    stats = trainer.update_weights(3)
    full = trainer.full_state_dict()
    trainer.close_weight_group()
    if index == 0:
        torch.save({"stats": stats, "full": full}, f"{out}/d_send.pt")
    trainer.shutdown()


def test_update_weights_broadcasts_every_parameter_in_order(model_dir, tmp_path):
    queue = mp.get_context("spawn").Queue()
    _spawn(_sync_worker, 3, free_port(), str(model_dir), str(tmp_path), queue)
    sent, recv = torch.load(tmp_path / "d_send.pt"), torch.load(tmp_path / "d_recv.pt")
    requests = recv["requests"]
    assert sent["stats"]["num_buckets"] == len(requests) > 2
    assert sent["stats"]["bytes"] == sum(t.numel() * t.element_size() for t in sent["full"].values())
    assert [name for r in requests for name in r["names"]] == list(sent["full"])  # parameter order
    assert [r["flush_cache"] for r in requests] == [False] * (len(requests) - 1) + [True]
    assert {r["weight_version"] for r in requests} == {"3"}
    assert {r["load_format"] for r in requests} == {"flattened_bucket"}  # one broadcast per bucket
    assert recv["last"] == ("destroy", "sync") and recv["rank"] == 1  # the group ends on the engine too
    for name, tensor in sent["full"].items():
        assert torch.equal(recv["received"][name], tensor), name


def _start_server(model_dir: str, session: str):
    import subprocess
    import sys

    from infra.engines.client import EngineClient

    port = free_port()
    cmd = [sys.executable, "-m", "infra.engine_server.server", "--model-path", model_dir, "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--weight-update-session", session])
    return f"http://{ADDR}:{port}", proc, EngineClient(f"http://{ADDR}:{port}")


def _server_worker(rank: int, port: int, model_dir: str, out: str, urls: list[str]) -> None:
    from infra.engines.client import EngineClient
    from infra.trainer.rank import TrainerRank, _full
    from infra.weights.check import WeightMismatchError

    torch.set_num_threads(1)
    trainer = TrainerRank(_cfg(), rank, 2)
    trainer.setup(model_dir, {}, ADDR, port)
    trainer.train(0, _batch(0))
    trainer.connect_engines(urls)
    trainer.open_weight_group("prl-test-sync")
    result = {"stats": trainer.update_weights(7), "check": trainer.check_weights_equal()}
    with torch.no_grad():  # what the check can see: the leading 100 rows of every tensor
        result["leading_values"] = sum(_full(p)[:100].numel() for p in trainer.model.parameters())
    if rank == 0:
        result["versions"] = [EngineClient(u).model_info()["weight_version"] for u in urls]
        result["sessions"] = [link.has_session for link in trainer._links]
        result["offsets"] = [link.rank_offset for link in trainer._links]
        EngineClient(urls[1]).update_weights_from_disk(
            model_dir
        )  # engine 2 falls back to the initial weights
    torch.distributed.barrier()
    try:
        trainer.check_weights_equal()
    except WeightMismatchError as exc:
        result["mismatch"], result["mismatch_report"] = str(exc), exc.report
    trainer.close_weight_group()
    if rank == 0:
        torch.save(result, f"{out}/server.pt")
    trainer.shutdown()


def test_update_weights_to_two_builtin_engines_of_both_protocols(model_dir, tmp_path):
    """Two engine servers, one per protocol generation (update session on and off), at rank
    offsets 1 and 2 of one group; then engine 2 is perturbed and the check reports it."""
    from infra.engines.client import EngineError
    from infra.engines.launch import stop_engine

    engines = [_start_server(str(model_dir), session) for session in ("on", "off")]
    try:
        for _, _, client in engines:
            client.wait_healthy(180)
        urls = [url for url, _, _ in engines]
        _spawn(_server_worker, 2, free_port(), str(model_dir), str(tmp_path), urls)
        for _, _, client in engines:  # destroyed at close: the group name is gone on each engine
            with pytest.raises(EngineError, match="group_name"):
                client.destroy_weights_update_group("prl-test-sync")
    finally:
        for _, proc, _ in engines:
            stop_engine(proc)
    result = torch.load(tmp_path / "server.pt")
    assert result["versions"] == ["7", "7"]
    assert result["sessions"] == [True, False] and result["offsets"] == [1, 2]
    # 2 layers x 9 + embed, norm, head, each on both engines
    assert result["check"]["weights_checked"] == 21 and result["check"]["max_abs_diff"] == 0.0
    assert result["check"]["values_checked"] == 2 * result["leading_values"] > 0
    # engine 2 differs from its first tensor on: named, with the real size of the gap
    assert result["mismatch"].startswith(f"model.embed_tokens.weight: engine {urls[1]} differs")
    assert result["mismatch_report"]["max_abs_diff"] > 0
    assert all(urls[1] in m for m in result["mismatch_report"]["mismatches"])
