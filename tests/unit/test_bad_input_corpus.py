"""A corpus of bad input, each case with the error it must get: config settings (parsed as
`python -m flows.train key=value` parses them), prompt files, reward plug-ins and their
values, and HTTP requests to the built-in engine. None may be accepted silently, and each
must be refused fast, with a message naming the field, file or value."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import ValidationError

from infra.config import RunConfig
from infra.config_files import load_config
from infra.data.prompts import load_rows
from infra.preflight import PreflightError, preflight
from tests.config_tree import set_paths

# each case is refused within a second or two; the engine fixture builds a model first
pytestmark = pytest.mark.timeout(10)

# ---- config: CLI overrides --------------------------------------------------------------

TIMEOUT_FIELDS = [
    "cluster.collective_timeout_s",
    "rollout.startup_timeout_s",
    "rollout.request_timeout_s",
    "rollout.engine_health_timeout_s",
    "data.reward_timeout_s",
    "weight_sync.timeout_s",
]

CONFIG_CASES: list[tuple[str, list[str], type[Exception], str]] = [
    ("empty-storage-uri", ["storage.uri="], ValidationError, "storage.uri is empty"),
    ("blank-storage-uri", ["storage.uri='   '"], ValidationError, "storage.uri is empty"),
    ("tiny-temperature", ["rollout.sampling.temperature=1e-30"], ValidationError, "rollout.sampling.temperature"),
    ("zero-temperature", ["rollout.sampling.temperature=0"], ValidationError, "greater than or equal to 0.01"),
    ("negative-temperature", ["rollout.sampling.temperature=-1"], ValidationError, "rollout.sampling.temperature"),
    ("nan-temperature", ["rollout.sampling.temperature=.nan"], ValidationError, "finite number"),
    ("tiny-eval-temperature", ["eval.temperature=1e-9"], ValidationError, "eval.temperature=1e-09: use 0 for greedy"),
    ("negative-eval-temperature", ["eval.temperature=-0.5"], ValidationError, "eval.temperature"),
    ("top-k-zero", ["rollout.sampling.top_k=0"], ValidationError, "top_k=0 keeps no token"),
    ("top-k-below-off", ["rollout.sampling.top_k=-5"], ValidationError, "rollout.sampling.top_k"),
    ("top-p-zero", ["rollout.sampling.top_p=0"], ValidationError, "rollout.sampling.top_p"),
    ("top-p-above-one", ["rollout.sampling.top_p=1.5"], ValidationError, "rollout.sampling.top_p"),
    ("no-new-tokens", ["rollout.sampling.max_new_tokens=0"], ValidationError, "rollout.sampling.max_new_tokens"),
    ("lr-inf", ["algorithm.lr=inf"], ValidationError, "finite number"),
    ("lr-yaml-inf", ["algorithm.lr=.inf"], ValidationError, "algorithm.lr"),
    ("lr-nan", ["algorithm.lr=.nan"], ValidationError, "finite number"),
    ("lr-minus-inf", ["algorithm.lr=-.inf"], ValidationError, "algorithm.lr"),
    ("lr-zero", ["algorithm.lr=0"], ValidationError, "algorithm.lr"),
    ("lr-negative", ["algorithm.lr=-1e-3"], ValidationError, "algorithm.lr"),
    ("lr-text", ["algorithm.lr=fast"], ValidationError, "algorithm.lr"),
    ("critic-lr-nan", ["critic.lr=nan"], ValidationError, "critic.lr"),
    ("grad-clip-inf", ["algorithm.grad_clip=.inf"], ValidationError, "algorithm.grad_clip"),
    ("eps-clip-nan", ["algorithm.eps_clip=nan"], ValidationError, "algorithm.eps_clip"),
    ("kl-coef-inf", ["algorithm.kl_coef=.inf"], ValidationError, "algorithm.kl_coef"),
    ("beta-nan", ["algorithm.betas=[0.9, .nan]"], ValidationError, "algorithm.betas"),
    ("beta-one", ["algorithm.betas=[1.0, 0.9]"], ValidationError, "each must lie in [0, 1)"),
    ("gamma-above-one", ["algorithm.gamma=1.5"], ValidationError, "algorithm.gamma"),
    ("tis-cap-zero", ["algorithm.tis_cap=0"], ValidationError, "algorithm.tis_cap"),
    ("bucket-inf", ["weight_sync.bucket_size_mb=.inf"], ValidationError, "weight_sync.bucket_size_mb"),
    ("cpus-nan", ["cluster.engines.cpus_per_worker=.nan"], ValidationError, "cluster.engines.cpus_per_worker"),
    ("resource-inf", ["cluster.trainer.resources={gpu_node: .inf}"], ValidationError, "resources.gpu_node"),
    ("sglang-arg-nan", ["rollout.sglang_args={mem_fraction_static: .nan}"], ValidationError, "mem_fraction_static"),
    ("backoff-inf", ["data.remote_reward.backoff_s=.inf"], ValidationError, "data.remote_reward.backoff_s"),
    ("failed-fraction-nan", ["data.max_failed_fraction=.nan"], ValidationError, "data.max_failed_fraction"),
    ("heads-3", ["model.tiny.num_heads=3"], ValidationError, "num_heads=3 must divide model.tiny.hidden_size=64"),
    ("heads-5", ["model.tiny.num_heads=5"], ValidationError, "model.tiny.num_heads=5"),
    ("odd-head-width", ["model.tiny.hidden_size=96", "model.tiny.num_heads=32"], ValidationError, "even width"),
    ("heads-zero", ["model.tiny.num_heads=0"], ValidationError, "model.tiny.num_heads"),
    *[(f"{f}-zero", [f"{f}=0"], ValidationError, f) for f in TIMEOUT_FIELDS],
    *[(f"{f}-negative", [f"{f}=-1"], ValidationError, f) for f in TIMEOUT_FIELDS],
    ("storage-retry-negative", ["storage.retry_timeout_s=-1"], ValidationError, "storage.retry_timeout_s"),
    ("timeout-inf", ["cluster.collective_timeout_s=.inf"], ValidationError, "finite number"),
    ("ray-client", ["cluster.ray_address=ray://host:10001"], ValidationError, "Ray Client (ray://)"),
    ("ray-client-ip", ["cluster.ray_address=ray://127.0.0.1:10001"], ValidationError, "py_modules"),
    ("ray-dashboard-url", ["cluster.ray_address=https://head:8265"], ValidationError, "URL schemes"),
    ("no-prompts", ["rollout.prompts_per_rollout=0"], ValidationError, "rollout.prompts_per_rollout"),
    ("group-of-one", ["rollout.n_samples_per_prompt=1"], ValidationError, "n_samples_per_prompt must be >= 2"),
    ("batch-not-dividing", ["algorithm.global_batch_size=100"], ValidationError, "must divide"),
    (
        "batch-vs-ranks",
        ["algorithm.global_batch_size=32", "cluster.trainer.num_workers=3"],
        ValidationError,
        "cluster.trainer.num_workers=3",
    ),
    ("no-iterations", ["num_rollout=0"], ValidationError, "num_rollout"),
    ("huge-iterations", ["num_rollout=1e400"], ValidationError, "num_rollout"),
    ("run-name-escape", ["run_name=../escape"], ValidationError, "run_name"),
    ("unknown-mode", ["mode=fast"], ValidationError, "mode"),
    ("resume-nonsense", ["checkpoint.resume=sometimes"], ValidationError, "checkpoint.resume"),
    ("ppo-without-critic", ["algorithm.advantage_estimator=ppo"], ValidationError, "critic.enabled"),
    ("tp-on-torch", ["rollout.tp_size=2"], ValidationError, "rollout.tp_size=2"),
    ("colocate-async", ["cluster.colocate=true"], ValidationError, "needs mode=sync"),
    ("unknown-section", ["no_such_section.x=1"], ValidationError, "no_such_section"),
    ("typo-field", ["algorithm.lrr=1"], ValidationError, "algorithm.lrr"),
    ("pass-k-zero", ["eval.pass_k=[0]"], ValidationError, "eval.pass_k"),
    ("seed-negative", ["rollout.seed=-1"], ValidationError, "rollout.seed"),
    ("seed-too-big", ["rollout.seed=4194304"], ValidationError, "rollout.seed"),
    ("overlong-policy", ["data.overlong_prompt=cut"], ValidationError, "data.overlong_prompt"),
    ("eval-set-name", ["eval.datasets=[{name: 'bad name', path: x}]"], ValidationError, "eval.datasets.0.name"),
    (
        "eval-set-duplicates",
        ["eval.datasets=[{name: a, path: x}, {name: a, path: y}]"],
        ValidationError,
        "names must be unique",
    ),
    ("stop-not-a-list", ["rollout.sampling.stop=5"], ValidationError, "rollout.sampling.stop"),
    ("override-without-value", ["novalue"], ValueError, "key.path=value"),
    ("override-without-key", ["=3"], ValueError, "key.path=value"),
    ("override-into-a-value", ["num_rollout=3", "num_rollout.x=1"], ValueError, "'num_rollout' is a value"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "error", "message"), [c[1:] for c in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES]
)
def test_config(overrides: list[str], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as raised:
        load_config(None, overrides)
    assert message in str(raised.value)


# ---- prompt files -----------------------------------------------------------------------


def _jsonl(rows: list) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


GOOD = {"prompt": "1:", "label": "1"}
# name, file name, content (text or bytes), error, message
FILE_CASES: list[tuple[str, str, str | bytes, type[Exception], str]] = [
    ("empty-prompt", "a.jsonl", _jsonl([GOOD, {"prompt": "", "label": "1"}]), ValueError, "holds an empty prompt in"),
    ("blank-prompt", "a.jsonl", _jsonl([{"prompt": "   ", "label": "1"}]), ValueError, "(row 0)"),
    ("newline-prompt", "a.jsonl", _jsonl([{"prompt": "\n", "label": "1"}]), ValueError, "empty prompt"),
    ("no-messages", "a.jsonl", _jsonl([{"prompt": [], "label": "1"}]), ValueError, "empty prompt"),
    ("null-prompt", "a.jsonl", _jsonl([{"prompt": None, "label": "1"}]), ValueError, "column 'prompt' is empty"),
    ("nan-prompt", "a.jsonl", '{"prompt": NaN, "label": "1"}\n', ValueError, "column 'prompt' is empty"),
    ("null-label", "a.jsonl", _jsonl([{"prompt": "1:", "label": None}]), ValueError, "column 'label' is empty"),
    ("no-prompt-column", "a.jsonl", _jsonl([{"q": "1:", "label": "1"}]), ValueError, "column 'prompt' missing"),
    ("no-label-column", "a.jsonl", _jsonl([{"prompt": "1:"}]), ValueError, "column 'label' missing"),
    ("list-of-text", "a.jsonl", _jsonl([{"prompt": ["hi"], "label": "1"}]), ValueError, "messages with role"),
    ("message-no-role", "a.jsonl", _jsonl([{"prompt": [{"content": "x"}], "label": "1"}]), ValueError, "role"),
    ("broken-json", "a.jsonl", _jsonl([GOOD]) + '{"prompt": \n', ValueError, "line 2: invalid JSON"),
    ("array-row", "a.jsonl", _jsonl([GOOD, [1, 2]]), ValueError, "must be a JSON object"),
    ("json-object", "a.json", json.dumps({"prompt": "1:"}), ValueError, "must hold a JSON list"),
    ("json-broken", "a.json", "[{", ValueError, "invalid JSON"),
    ("no-rows", "a.jsonl", "", ValueError, "no rows in"),
    ("blank-lines-only", "a.jsonl", "\n\n", ValueError, "no rows in"),
    ("not-utf8", "a.jsonl", b'{"prompt": "\xff\xfe", "label": "1"}\n', ValueError, "is not UTF-8"),
    ("csv", "a.csv", "prompt,label\n1:,1\n", ValueError, "unsupported prompt file"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "content", "error", "message"), [c[1:] for c in FILE_CASES], ids=[c[0] for c in FILE_CASES]
)
def test_prompt_file(tmp_path: Path, name: str, content, error: type[Exception], message: str) -> None:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(error) as raised:
        load_rows(str(path), "prompt", "label", {})
    assert message in str(raised.value)
    assert name in str(raised.value) or message == "must be a JSON object"


@pytest.mark.parametrize(
    ("path", "error", "message"),
    [
        ("/no/such/prompts.jsonl", FileNotFoundError, "prompt file not found: /no/such/prompts.jsonl"),
        ("builtin:no-such-task", ValueError, "unknown built-in task 'no-such-task'"),
        ("builtin:digit-copy:test", ValueError, "split must be 'train', 'eval' or 'sft', got 'test'"),
    ],
    ids=["missing-file", "unknown-builtin", "unknown-split"],
)
def test_prompt_source(path: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        load_rows(path, "prompt", "label", {})


def _run(tmp_path: Path, rows: list[dict] | None = None, **tree) -> RunConfig:
    base: dict = {"storage": {"uri": str(tmp_path / "runs")}, "run_name": "r"}
    if rows is not None:
        data = tmp_path / "data.jsonl"
        data.write_text(_jsonl(rows))
        base["data"] = {"train_path": str(data), "eval_path": str(data)}
        base["rollout"] = {"prompts_per_rollout": 1}
    set_paths(base, tree)
    return RunConfig.model_validate(base)


ROW = {"prompt": "1:", "label": "1"}
# name, rows of the data file (None: the built-in task), more settings, message
PREFLIGHT_CASES: list[tuple[str, list[dict] | None, dict, str]] = [
    ("batch-over-data", [ROW] * 3, {"rollout__prompts_per_rollout": 4}, "rollout.prompts_per_rollout=4 exceeds the 3 prompts"),
    ("accented", [ROW, {"prompt": "caf\u00e9:", "label": "1"}], {}, "row 1: the model's tokenizer has no token for '\u00e9' (U+00E9)"),
    ("cjk", [{"prompt": "\u4e2d:", "label": "1"}], {}, "U+4E2D"),
    ("emoji", [{"prompt": "\U0001f600", "label": "1"}], {}, "U+1F600"),
    ("tab", [{"prompt": "1:\t", "label": "1"}], {}, "'\\t' (U+0009)"),
    ("nbsp", [{"prompt": "1:\u00a0", "label": "1"}], {}, "U+00A0"),
    ("chat-accented", [{"prompt": [{"role": "user", "content": "\u00fc"}], "label": "1"}], {}, "U+00FC"),
    ("system-prompt", None, {"data__system_prompt": "r\u00e9sum\u00e9"}, "data.system_prompt: the model's tokenizer has no token for"),
    ("prompt-too-long", [{"prompt": "7" * 200, "label": "7"}], {}, "row 0 has a prompt of 200 tokens"),
    ("no-room", None, {"rollout__sampling__max_new_tokens": 64}, "rollout.sampling.max_new_tokens=64 leaves no room"),
    ("stop-two-tokens", None, {"rollout__sampling__stop": ["ab"]}, "rollout.sampling.stop: 'ab' is 2 tokens"),
    ("unknown-model", None, {"model__path": "builtin:huge-llama"}, "model.path: unknown built-in model"),
    ("model-not-hf", None, {"model__path": "/etc"}, "model.path: no HF model directory (config.json) at /etc"),
    ("unknown-reward", None, {"data__reward": "no_such_reward"}, "data.reward: unknown reward 'no_such_reward'"),
    ("reward-module-missing", None, {"data__reward": "no_such_mod_xyz:f"}, "data.reward: cannot load reward"),
    ("reward-not-callable", None, {"data__reward": "math:pi"}, "data.reward: reward 'math:pi' is not callable"),
    ("reward-file-missing", None, {"data__reward": "/no/such/reward.py:f"}, "no such file: /no/such/reward.py"),
    ("eval-set-missing", None, {"eval__datasets": [{"name": "x", "path": "/no/x.jsonl"}]}, "eval.datasets[x].path"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("rows", "tree", "message"), [c[1:] for c in PREFLIGHT_CASES], ids=[c[0] for c in PREFLIGHT_CASES]
)
def test_preflight(tmp_path: Path, rows, tree: dict, message: str) -> None:
    with pytest.raises(PreflightError) as raised:
        preflight(_run(tmp_path, rows, **tree))
    assert message in str(raised.value)
    assert not (tmp_path / "runs").exists()  # refused before anything was written


# ---- reward functions and the values they return ---------------------------------------


def _returning(value: object) -> Callable:
    def bad_reward(prompt: str, response: str, label: str, **kw) -> object:
        return value

    return bad_reward


def _raising(prompt: str, response: str, label: str, **kw) -> float:
    raise RuntimeError("judge unreachable")


async def _async_huge(prompt: str, response: str, label: str, **kw) -> float:
    return 1e308


def _batch_inf() -> Callable:
    from infra.data.group_rewards import batch_reward

    @batch_reward
    def batch_inf(prompts, responses, labels, **kw):
        return [math.inf] * len(prompts)

    return batch_inf


def _batch_short() -> Callable:
    from infra.data.group_rewards import batch_reward

    @batch_reward
    def batch_short(prompts, responses, labels, **kw):
        return [1.0]

    return batch_short


REWARD_CASES: list[tuple[str, Callable[[], Callable], str]] = [
    ("plus-1e308", lambda: _returning(1e308), "returned 1e+308: rewards must be finite numbers within +-1e+06"),
    ("minus-1e308", lambda: _returning(-1e308), "returned -1e+308"),
    ("above-bound", lambda: _returning(1e7), "returned 10000000.0"),
    ("int-overflowing-float", lambda: _returning(10**400), "must be finite numbers within"),
    ("inf", lambda: _returning(math.inf), "returned inf"),
    ("minus-inf", lambda: _returning(-math.inf), "returned -inf"),
    ("nan", lambda: _returning(math.nan), "returned nan"),
    ("text", lambda: _returning("1"), "must return a finite number, got '1'"),
    ("none", lambda: _returning(None), "got None"),
    ("list", lambda: _returning([1.0]), "got [1.0]"),
    ("complex", lambda: _returning(1j), "got 1j"),
    ("raises", lambda: _raising, "RuntimeError: judge unreachable"),
    ("async-huge", lambda: _async_huge, "_async_huge returned 1e+308"),
    ("batch-inf", _batch_inf, "batch_inf returned inf"),
    ("batch-wrong-count", _batch_short, "a batch reward returned 1 rewards for 4 samples"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "message"), [c[1:] for c in REWARD_CASES], ids=[c[0] for c in REWARD_CASES])
def test_reward_value(make: Callable[[], Callable], message: str) -> None:
    from infra.config import AlgorithmConfig
    from infra.rollout.batch import Sample
    from infra.rollout.scoring import TooManyFailedSamples, check_failures, score_samples

    samples = [Sample("p", "l", "r", [1], [2], [0.0], 0, i // 2) for i in range(4)]
    score_samples(samples, make(), AlgorithmConfig())
    assert all(s.status == "failed" and s.reward == 0 for s in samples)
    assert all(math.isfinite(s.advantage) for s in samples)  # nothing overflowed
    with pytest.raises(TooManyFailedSamples) as raised:
        check_failures(samples, 0.5, "rollouts/0.parquet")
    assert message in str(raised.value)


# ---- HTTP requests to the built-in engine -----------------------------------------------


@dataclass
class Http:
    path: str
    body: object = None  # JSON, raw bytes, or an iterator of byte chunks
    status: int = 400
    message: str = ""
    method: str = "POST"


SEVEN_MIB = b'{"input_ids": [' + b"1," * (7 * 2**19) + b"1]}"
HTTP_CASES: dict[str, Http] = {
    "not-json": Http("/generate", b"{not json", message="body: Invalid JSON"),
    "empty-body": Http("/generate", b"", message="body: Invalid JSON: EOF"),
    "array-body": Http("/generate", b"[]", message="body: Input should be an object"),
    "null-body": Http("/generate", b"null", message="body: Input should be an object"),
    "ids-as-text": Http("/generate", {"input_ids": "abc"}, message="input_ids"),
    "no-input": Http("/generate", {}, message="one of input_ids or text is required"),
    "empty-ids": Http("/generate", {"input_ids": []}, message="input_ids: empty prompt"),
    "empty-row": Http("/generate", {"input_ids": [[]]}, message="input_ids: empty prompt"),
    "empty-text": Http("/generate", {"text": ""}, message="input_ids: empty prompt"),
    "negative-id": Http("/generate", {"input_ids": [[-1]]}, message="token ids must lie in [0, "),
    "huge-id": Http("/generate", {"input_ids": [[10**9]]}, message="token ids must lie in [0, "),
    "many-bad-ids": Http("/generate", {"input_ids": [["x"] * 1000] * 100}, message="input_ids"),
    "text-accented": Http("/generate", {"text": "caf\u00e9"}, message="text: the model's tokenizer has no token for '\u00e9' (U+00E9)"),
    "text-emoji": Http("/generate", {"text": ["1:", "\U0001f600"]}, message="U+1F600"),
    "too-many-tokens": Http("/generate", {"input_ids": [[5] * 300_000] * 2}, message="600000 prompt tokens exceed"),
    "too-much-text": Http("/generate", {"text": ["a" * 300_000] * 2}, message="text: 600000 characters exceed"),
    "beyond-positions": Http("/generate", {"input_ids": [[5] * 300]}, message="fills the model's 256 positions"),
    "new-tokens-negative": Http("/generate", {"input_ids": [5], "sampling_params": {"max_new_tokens": -1}},
                                message="sampling_params.max_new_tokens"),
    "new-tokens-huge": Http("/generate", {"input_ids": [5], "sampling_params": {"max_new_tokens": 10**12}},
                            message="sampling_params.max_new_tokens"),
    "temperature-negative": Http("/generate", {"input_ids": [5], "sampling_params": {"temperature": -1}},
                                 message="sampling_params.temperature"),
    "temperature-text": Http("/generate", {"input_ids": [5], "sampling_params": {"temperature": "hot"}},
                             message="sampling_params.temperature"),
    "top-p-zero": Http("/generate", {"input_ids": [5], "sampling_params": {"top_p": 0}}, message="sampling_params.top_p"),
    "top-p-two": Http("/generate", {"input_ids": [5], "sampling_params": {"top_p": 2}}, message="sampling_params.top_p"),
    "top-k-zero": Http("/generate", {"input_ids": [5], "sampling_params": {"top_k": 0}},
                       message="sampling_params.top_k: Value error, must be -1"),
    "top-k-minus-two": Http("/generate", {"input_ids": [5], "sampling_params": {"top_k": -2}}, message="sampling_params.top_k"),
    "n-zero": Http("/generate", {"input_ids": [5], "sampling_params": {"n": 0}}, message="sampling_params.n"),
    "n-huge": Http("/generate", {"input_ids": [5], "sampling_params": {"n": 10**6}}, message="sampling_params.n"),
    "seed-negative": Http("/generate", {"input_ids": [5], "sampling_params": {"sampling_seed": -1}},
                          message="sampling_params.sampling_seed"),
    "seed-huge": Http("/generate", {"input_ids": [5], "sampling_params": {"sampling_seed": 2**70}},
                      message="sampling_params.sampling_seed"),
    "unknown-sampling-field": Http("/generate", {"input_ids": [5], "sampling_params": {"min_p": 0.1}}, message="min_p"),
    "unknown-field": Http("/generate", {"input_ids": [5], "bogus": 1}, message="bogus"),
    "stop-two-tokens": Http("/generate", {"input_ids": [5], "sampling_params": {"stop": "ab"}},
                            message="'ab' is not a single token"),
    "stream": Http("/generate", {"input_ids": [5], "stream": True}, message="streaming is not supported"),
    "duplicate-rids": Http("/generate", {"input_ids": [[5], [6]], "rid": ["a", "a"]}, message="duplicate request ids"),
    "params-per-input": Http("/generate", {"input_ids": [[5], [6]], "sampling_params": [{}]},
                             message="1 entries for 2 inputs"),
    "body-over-limit": Http("/generate", SEVEN_MIB, 413, "exceed the engine's limit of 6291456"),
    "chunked-over-limit": Http("/generate", "chunks", 413, "more than 6291456 bytes exceed"),
    "weights-not-json": Http("/get_weights_by_name", b"{", message="body: not valid JSON"),
    "weights-array": Http("/get_weights_by_name", b"[1]", message="body: a JSON object"),
    "weights-unknown": Http("/get_weights_by_name", {"name": "nope"}, message="name: unknown parameter 'nope'"),
    "weights-bad-size": Http("/get_weights_by_name", {"name": "model.norm.weight", "truncate_size": "x"},
                             message="truncate_size"),
    "disk-etc": Http("/update_weights_from_disk", {"model_path": "/etc"}, message="'/etc' is not an HF model directory"),
    "disk-file": Http("/update_weights_from_disk", {"model_path": "/etc/passwd"}, message="not an HF model directory"),
    "disk-empty": Http("/update_weights_from_disk", {"model_path": ""}, message="not an HF model directory"),
    "disk-no-path": Http("/update_weights_from_disk", {}, message="model_path: Field required"),
    "group-of-one": Http("/init_weights_update_group",
                         {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 1},
                         message="world_size"),
    "rank-outside": Http("/init_weights_update_group",
                         {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 5, "world_size": 2},
                         message="rank_offset: 5 is outside the group of 2"),
    "backend-mpi": Http("/init_weights_update_group",
                        {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2,
                         "backend": "mpi"}, message="backend"),
    "dead-master": Http("/init_weights_update_group",
                        {"master_address": "127.0.0.1", "master_port": "DEAD", "rank_offset": 1, "world_size": 2},
                        504, "the master 127.0.0.1:"),
    "update-lengths": Http("/update_weights_from_distributed", {"names": ["a"], "dtypes": [], "shapes": []},
                           message="names/dtypes/shapes: lengths differ"),
    "update-outside-session": Http("/update_weights_from_distributed",
                                   {"names": ["a"], "dtypes": ["float32"], "shapes": [[1]]},
                                   message="must run between begin_weight_update() and end_weight_update()"),
    "update-bad-format": Http("/update_weights_from_distributed",
                              {"names": [], "dtypes": [], "shapes": [], "load_format": "pickle"},
                              message="load_format"),
    "destroy-unknown": Http("/destroy_weights_update_group", {"group_name": "g"}, message="no weight-update group 'g'"),
    "end-without-begin": Http("/end_weight_update", {}, message="no weight-update session is open"),
    "pause-mode": Http("/pause_generation", {"mode": "freeze"}, message="mode"),
    "memory-tag": Http("/release_memory_occupation", {"tags": ["gpu"]}, message="tags"),
    "abort-rid-type": Http("/abort_request", {"rid": 5}, message="rid"),
    "generate-by-get": Http("/generate", method="GET", status=405, message="Method Not Allowed"),
    "no-such-route": Http("/update_weights_from_tensor", {}, 404, "Not Found"),
}  # fmt: skip


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Iterator:
    from fastapi.testclient import TestClient

    from infra.config import TinyModelConfig
    from infra.engine_server.engine_state import EngineState
    from infra.engine_server.server import create_app
    from infra.model.tiny import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig(max_position_embeddings=256))
    state = EngineState(str(model), seed=0, weight_version="0", group_timeout_s=1.0)
    with TestClient(create_app(state)) as http:
        yield http


@pytest.mark.parametrize("case", list(HTTP_CASES.values()), ids=list(HTTP_CASES))
def test_engine_request(engine, case: Http) -> None:
    from tests.ports import free_port

    body = case.body
    if case.path == "/init_weights_update_group" and body.get("master_port") == "DEAD":
        body = {**body, "master_port": free_port()}
    kwargs: dict = {}
    if body == "chunks":
        kwargs["content"] = iter([SEVEN_MIB[i : i + 2**20] for i in range(0, len(SEVEN_MIB), 2**20)])
    elif isinstance(body, bytes):
        kwargs["content"] = body
    elif body is not None:
        kwargs["content"] = json.dumps(body).encode()
    resp = engine.request(case.method, case.path, headers={"content-type": "application/json"}, **kwargs)
    assert resp.status_code == case.status, resp.text[:500]
    reply = resp.json()
    assert case.message in str(reply.get("message", reply.get("detail"))), resp.text[:500]
    assert engine.get("/health").status_code == 200
