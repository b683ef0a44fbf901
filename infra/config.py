"""The one config tree of a training run.

It is the `train` flow's only parameter, so the Prefect UI renders it as a form: every
field carries a description and a default that runs the tiny CPU demo. This module must
stay importable without torch or ray (the Prefect UI, deployments and tests parse it).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

RESUME_MODES = ("never", "fresh", "auto")
# The layers the built-in engine applies a LoRA adapter to itself (weight_sync.lora=adapter)
BUILTIN_LORA_TARGETS = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "lm_head",
)
# Lowest sampling temperature of a run. The trainer takes logprobs of logits / T; far below
# this they turn into 0 / -inf (1e-30 gives NaN losses), and the samples of a GRPO group
# become copies of the greedy answer, with no learning signal. Evaluation may ask for 0.
MIN_TEMPERATURE = 0.01


class _Section(BaseModel):
    # Unknown keys are typos: reject them instead of silently ignoring a setting. A NaN or
    # infinite number is never a meaningful setting (an `algorithm.lr=inf` would surface only
    # as NaN weights at the first save), so every float must be finite.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# Seeds lie in [0, SEED_LIMIT): the rollout manager packs rollout.seed * 2**40 into a sample's
# 64-bit sampling seed. A derived seed is (seed + its field's offset) mod SEED_LIMIT.
SEED_LIMIT = 2**22
# Pass as `model_dump(context=RESOLVED_SEEDS)` to dump derived seeds as the numbers they
# resolved to (what a run trains with: checkpoint identity, cache keys, trackers) instead
# of empty (what a config file or the Prefect form should hold, so that `seed` drives them).
RESOLVED_SEEDS = {"resolved_seeds": True}


def derived_seed(seed: int, offset: int) -> int:
    return (seed + offset) % SEED_LIMIT


class _SeededSection(_Section):
    """A section with one seed field that, left empty, derives from the run's `seed`.

    Standalone, an empty seed takes seed 0's derivation; `RunConfig` derives it again from its
    own `seed`. A derived seed dumps as empty, so a dumped config re-derives it from `seed`."""

    seed_field: ClassVar[str]
    seed_offset: ClassVar[int]
    _seed_derived: bool = PrivateAttr(False)

    @model_validator(mode="after")
    def _derive_empty_seed(self) -> Any:
        if getattr(self, self.seed_field) is None:
            setattr(self, self.seed_field, derived_seed(0, self.seed_offset))
            self._seed_derived = True
        return self

    def with_run_seed(self, seed: int) -> Any:
        """This section with its seed derived from `seed`, unless the seed was set explicitly."""
        if not self._seed_derived:
            return self
        section = self.model_copy(update={self.seed_field: derived_seed(seed, self.seed_offset)})
        section._seed_derived = True
        return section

    @model_serializer(mode="wrap")
    def _derived_seed_as_empty(self, handler: Any, info: SerializationInfo) -> Any:
        data = handler(self)
        resolved = (info.context or {}).get("resolved_seeds")
        if self._seed_derived and not resolved and isinstance(data, dict) and self.seed_field in data:
            data[self.seed_field] = None
        return data


def _greedy_or_tempered(value: float | None, field: str) -> float | None:
    if value is not None and 0 < value < MIN_TEMPERATURE:
        raise ValueError(
            f"{field}={value:g}: use 0 for greedy decoding or at least {MIN_TEMPERATURE:g} "
            "(below that logprobs at the temperature are 0 or -inf)"
        )
    return value


class TinyModelConfig(_SeededSection):
    """Shape of the built-in tiny Llama model (used when `model.path` is `builtin:tiny-llama`)."""

    seed_field: ClassVar[str] = "seed"
    seed_offset: ClassVar[int] = 0

    hidden_size: int = Field(64, ge=8, description="Width of the residual stream.")
    num_layers: int = Field(2, ge=1, description="Number of decoder layers.")
    num_heads: int = Field(4, ge=1, description="Attention heads per layer.")
    intermediate_size: int = Field(256, ge=8, description="Width of the MLP.")
    max_position_embeddings: int = Field(64, ge=8, description="Longest prompt plus response, in tokens.")
    seed: int | None = Field(
        None,
        ge=0,
        description="Seed of the random initialisation. Empty: derived from the run's `seed` (equal to it).",
    )

    @model_validator(mode="after")
    def _heads_fit(self) -> TinyModelConfig:
        # Llama splits the width evenly over the heads, and rotary embeddings rotate pairs
        # of a head's dimensions, so each head needs an even width.
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ValueError(
                f"model.tiny.num_heads={self.num_heads} must divide model.tiny.hidden_size="
                f"{self.hidden_size} into heads of an even width"
            )
        return self


class LoraConfig(_Section):
    """A LoRA adapter trained instead of the full model (peft). The base weights stay frozen;
    only the adapter and its optimizer state are trained and checkpointed."""

    r: int = Field(8, ge=1, description="Rank of the adapter's low-rank update B @ A.")
    alpha: float = Field(
        16, gt=0, description="Scale of the update: W + (alpha / r) * B @ A (peft's `lora_alpha`)."
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input while training.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="Names of the linear layers that get an adapter (peft's `target_modules`), e.g. "
        "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.",
    )


class ModelConfig(_Section):
    path: str = Field(
        "builtin:tiny-llama",
        description="HF model directory (local path or s3://...) loaded with from_pretrained. "
        "`builtin:tiny-llama` builds a tiny Llama with a character tokenizer under the run "
        "folder on first use.",
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Shape of the built-in model.")
    lora: LoraConfig | None = Field(
        None,
        description="Train a LoRA adapter on the frozen model (see `weight_sync.lora` for how engines "
        "get it). Empty: full fine-tuning.",
    )


class RoleResources(_Section):
    num_workers: int = Field(
        1, ge=1, description="Processes in this role (trainer or critic ranks, or engines)."
    )
    cpus_per_worker: float = Field(1.0, ge=0, description="Ray CPUs reserved per process.")
    gpus_per_worker: float = Field(
        0.0, ge=0, description="Ray GPUs reserved per process (0 on CPU machines)."
    )
    resources: dict[str, float] = Field(
        default_factory=dict,
        description='Custom Ray resources reserved per process, e.g. `{"trainer_node": 1}`: the role '
        "then runs only on nodes started with that resource (`ray start --resources ...`).",
    )


class ClusterConfig(_Section):
    ray_address: str = Field(
        "",
        description="Empty: start a local Ray cluster. `auto` or `host:port` (the head's GCS address): "
        "join an existing one from a node of it. Ray Client (`ray://`) is refused: the driver ships "
        "this repository's code to the workers as py_modules, which Ray Client does not carry.",
    )
    num_cpus: int | None = Field(
        None, ge=1, description="CPUs a local cluster advertises; default: enough for all roles."
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray placement group strategy for each role."
    )
    trainer: RoleResources = Field(
        default_factory=lambda: RoleResources(num_workers=2),
        description="Actor trainer ranks (one FSDP2 rank per worker).",
    )
    critic: RoleResources = Field(
        default_factory=lambda: RoleResources(num_workers=2),
        description="Critic ranks (one FSDP2 rank per worker, their own process group); placed only "
        "when critic.enabled.",
    )
    engines: RoleResources = Field(default_factory=RoleResources, description="Rollout engine servers.")
    colocate: bool = Field(
        False,
        description="Engines share the trainer's placement bundles (and GPUs) instead of their own; they "
        "release their weights and KV cache while the trainer trains and resume before the weight "
        "sync. Sync mode only; engines need num_workers <= trainer.num_workers.",
    )
    threads_per_worker: int = Field(
        1,
        ge=1,
        description="torch/OMP threads per trainer rank and engine; 1 avoids thrashing on small machines.",
    )
    fsdp_gather: Literal["per_step", "per_micro_batch"] = Field(
        "per_step",
        description="How often a trainer or critic rank all-gathers the sharded weights (and "
        "reduce-scatters gradients) when an optimizer step has several micro-batches. `per_step`: once "
        "per step, gathered weights and whole gradients kept across its micro-batches (as DDP holds "
        "them; far fewer collectives, bench.trainer_throughput compares the two). `per_micro_batch`: "
        "FSDP2's default, the least memory: weights gathered for every micro-batch's forward and "
        "backward, gradients reduced after each.",
    )
    trainer_class: str = Field(
        "",
        description="The trainer rank's actor class, `module:Class` or `file.py:Class`, built as "
        "`Class(cfg, rank, world_size)` once per rank of `cluster.trainer` and called with the methods "
        "`infra.trainer.rank.TrainerRank` answers (setup, train, update_weights, save_checkpoint, ...). "
        "A stand-in goes here, e.g. `bench.sim_trainer:SimTrainerRank`, which only waits a set time per "
        "sample (bench.scale_sweep). Empty: the FSDP2 trainer rank.",
    )
    collective_timeout_s: float = Field(
        300,
        gt=0,
        description="Timeout of the trainer ranks' process group: a collective whose peer died fails after "
        "this long instead of hanging (the flow itself notices a dead rank at once).",
    )

    @field_validator("ray_address")
    @classmethod
    def _no_ray_client(cls, value: str) -> str:
        if "://" in value:
            raise ValueError(
                f"cluster.ray_address={value!r}: Ray Client (ray://) and other URL schemes are not "
                "supported, because the driver ships code to the workers as py_modules; run the flow "
                "on a node of the cluster with `auto` or the head's `host:port`"
            )
        return value

    @field_validator("trainer_class")
    @classmethod
    def _class_spec(cls, value: str) -> str:
        module, sep, name = value.rpartition(":")
        if value and not (sep and module and name):
            raise ValueError(f"cluster.trainer_class={value!r}: give `module:Class` or `file.py:Class`")
        return value

    @field_validator("trainer", "critic", mode="before")
    @classmethod
    def _two_ranks_by_default(cls, value: object) -> object:
        # the default of 2 ranks holds when only other trainer fields are set, e.g.
        # `cluster.trainer.gpus_per_worker=1` (RoleResources' own default is 1 worker)
        if isinstance(value, dict) and "num_workers" not in value:
            return {"num_workers": 2, **value}
        return value


class SamplingConfig(_Section):
    temperature: float = Field(
        1.0,
        ge=MIN_TEMPERATURE,
        description=f"Sampling temperature, at least {MIN_TEMPERATURE:g} (greedy rollouts give a group "
        "no signal); logprobs are taken at this temperature.",
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(
        -1, ge=-1, description="Keep the k most likely tokens; -1 keeps all (0 is refused, as by SGLang)."
    )
    max_new_tokens: int = Field(1, ge=1, description="Longest response, in tokens.")
    stop: list[str] = Field(
        default_factory=lambda: ["\n"], description="Strings (single tokens) that end a response."
    )

    @field_validator("top_k")
    @classmethod
    def _top_k_off_or_positive(cls, value: int) -> int:
        if value == 0:
            raise ValueError("rollout.sampling.top_k=0 keeps no token; use -1 to keep all, or k >= 1")
        return value


class RolloutConfig(_SeededSection):
    seed_field: ClassVar[str] = "seed"
    seed_offset: ClassVar[int] = 1234

    engine: Literal["torch", "sglang"] = Field(
        "torch",
        description="`torch`: the built-in CPU/GPU server. `sglang`: SGLang servers; on GPUs, or on CPUs "
        "with `cluster.engines.gpus_per_worker: 0` (SGLang's torch-native CPU path, for small models and "
        "tests: `configs/sglang-cpu.yaml`).",
    )
    engine_urls: list[str] = Field(
        default_factory=list,
        description="Attach to engine servers that already run at these URLs (`http://host:port`, SGLang's "
        "HTTP API: `sglang.launch_server`, the built-in server or any server answering the same routes) "
        "instead of launching engines: no engine actors are placed, so `cluster.engines`, `engine` and "
        "`sglang_args` do not apply. They must serve the run's model and stay up for the run: one that "
        "fails is not restarted (no actor owns its process). Needs `weight_sync.method=broadcast` with "
        "full weights (disk and adapter sync load through the engines' actors). Empty: launch "
        "`cluster.engines.num_workers` engines.",
    )
    tp_size: int = Field(
        1,
        ge=1,
        description="Tensor-parallel GPUs per engine (SGLang `--tp-size`); an engine takes tp_size ranks "
        "of the weight-update group (rank_offset + tp_rank). The built-in engine runs with 1.",
    )
    prompts_per_rollout: int = Field(128, ge=1, description="Prompts trained on per iteration.")
    over_sample_prompts: int = Field(
        0,
        ge=0,
        description="Long-tailed responses: draw this many prompts more than `prompts_per_rollout`, one "
        "request per prompt group, and once `prompts_per_rollout` groups have come back abort the rest "
        "(`/abort_request`): the slowest groups, those holding the longest responses, no longer hold up "
        "the iteration. An iteration then spends `prompts_per_rollout + over_sample_prompts` prompts of "
        "the epoch, and the aborted ones are not trained on in it. It favours prompts whose groups "
        "finish sooner (shorter responses). 0: every group drawn is waited for. Not with "
        "`generate_fn`.",
    )
    n_samples_per_prompt: int = Field(8, ge=1, description="Responses per prompt (the GRPO group size).")
    sampling: SamplingConfig = Field(
        default_factory=SamplingConfig, description="Sampling of training rollouts."
    )
    seed: int | None = Field(
        None,
        ge=0,
        lt=SEED_LIMIT,
        description="Base seed of sampling; empty: derived from the run's `seed` as (seed + 1234) mod 2^22. "
        "Every sample gets its own `sampling_seed` (from this seed, the "
        "rollout id and the sample's index), never one per GRPO group. The built-in engine always honours "
        "it, so runs repeat exactly. SGLang honours it only when launched with "
        "`--enable-deterministic-inference` (`sglang_args`); otherwise SGLang samples at random.",
    )
    startup_timeout_s: float = Field(120, gt=0, description="How long an engine may take to answer /health.")
    request_timeout_s: float = Field(600, gt=0, description="Timeout of one HTTP request to an engine.")
    engine_health_timeout_s: float = Field(
        30,
        gt=0,
        description="While generating, each engine's /health is probed; an engine whose server has exited "
        "or has not answered for this long is restarted, re-joins the weight sync and gets the weights "
        "it held, and its unfinished requests run again (same seeds).",
    )
    engine_max_restarts: int = Field(
        3,
        ge=0,
        description="Restarts of one engine server per run before a fault fails the generate task "
        "(0: no restarts). With broadcast sync, trainer rank 0 keeps a copy of the last weights "
        "it sent (one model in the engines' dtype) so a restarted engine can get them while training runs; "
        "on CPU it also keeps the buffers of the push before, which the next push fills again.",
    )

    @property
    def prompts_drawn(self) -> int:
        """Prompts an iteration takes from the prompt stream (the over-sampled included)."""
        return self.prompts_per_rollout + self.over_sample_prompts

    @field_validator("engine_urls")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        from urllib.parse import urlsplit

        for url in value:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
                raise ValueError(
                    f"rollout.engine_urls: {url!r} is not a server's base URL (http://host:port)"
                )
        if len(set(value)) != len(value):
            raise ValueError("rollout.engine_urls: a URL appears twice (each engine would get two shares)")
        return value

    sglang_args: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Extra `sglang.launch_server` flags (engine=sglang only)."
    )
    sglang_python: str = Field(
        "",
        description="Python interpreter that runs `sglang.launch_server` (engine=sglang only), e.g. a "
        "separate venv's `bin/python` when SGLang's pins clash with the trainer's torch. Empty: the one "
        "`make sglang-venv` builds (`.venv-sglang/bin/python` in the repository) where it exists, else "
        "this process's interpreter.",
    )
    sglang_sleep_on_idle: bool | None = Field(
        None,
        description="SGLang `--sleep-on-idle`: an idle scheduler sleeps instead of polling (engine=sglang "
        "only). Empty: on for CPU engines (a polling scheduler holds ~0.6 of a core), off on GPUs.",
    )
    generate_fn: str | None = Field(
        None,
        description="A custom rollout function `module:function` or `file.py:function` (multi-turn, "
        "tool use): given a prompt group and an engine client, it returns trajectories with per-token "
        "loss masks (0 on tokens the environment wrote). Empty: single-turn sampling.",
    )
    dynamic_sampling: bool = Field(
        True,
        description="Drop prompt groups whose rewards all agree (no GRPO signal) and sample prompts "
        "again with new seeds (rollout.dynamic_sampling_resample) until the batch is full of groups "
        "with signal.",
    )
    dynamic_sampling_max_rounds: int = Field(
        8,
        ge=1,
        description="Extra sampling rounds at most; if the batch is still short, dropped groups fill it.",
    )
    dynamic_sampling_resample: Literal["all", "stuck"] = Field(
        "stuck",
        description="Which prompts an extra round samples again. `all`: every prompt of the batch. "
        "`stuck`: only prompts with no group with signal yet that scored below the highest reward of "
        "the run so far, so a prompt answered right on every sample is not sampled again (while no "
        "sample of the run has scored differently from another, every prompt without signal is); "
        "cheaper, and better on single-token tasks; on pair-copy worse with 3 extra rounds, better "
        "with 8 (docs/ALGORITHMS.md). A resume reads the run's rewards so far from the rollout file "
        "of the batch generated ahead, or in sync mode of the last trained iteration, so it draws as "
        "the straight run does; from another run's checkpoint they start afresh.",
    )


class RemoteRewardConfig(_Section):
    batch_size: int = Field(
        32, ge=1, description="Samples per request to a reward service (data.reward: http://...)."
    )
    concurrency: int = Field(4, ge=1, description="Requests in flight at once.")
    retries: int = Field(3, ge=0, description="Retries of a failed request (connection error, 5xx, timeout).")
    backoff_s: float = Field(0.5, ge=0, description="First retry delay; doubled for every further retry.")


class DataConfig(_SeededSection):
    seed_field: ClassVar[str] = "shuffle_seed"
    seed_offset: ClassVar[int] = 7

    train_path: str = Field(
        "builtin:digit-copy",
        description="Training prompts: jsonl or parquet (local or s3://), or `builtin:<task>`.",
    )
    eval_path: str | None = Field(
        None,
        description="Evaluation prompts, same formats. A `builtin:<task>` evaluates on its eval split: "
        "prompts it never trains on. Empty: a `builtin:<task>` train_path evaluates on that task's eval "
        "split; a train_path file evaluates on a held-out split of its rows (eval_holdout_fraction of "
        "them, at least one, drawn with shuffle_seed and never trained on); with eval.datasets set, "
        "nothing is held out.",
    )
    eval_holdout_fraction: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="Share of a train_path file's rows held out for evaluation when eval_path is empty "
        "(rounded, at least one row; the rest train).",
    )
    prompt_key: str = Field(
        "prompt", description="Column holding the prompt: text, or a list of chat messages {role, content}."
    )
    label_key: str = Field("label", description="Column holding the reference answer.")
    shuffle_seed: int | None = Field(
        None,
        ge=0,
        description="Seed of the per-epoch prompt shuffle, of the held-out eval split (eval_path empty) "
        "and of which eval.num_prompts prompts evaluate. Empty: derived from the run's `seed` (seed + 7).",
    )
    apply_chat_template: bool = Field(
        False,
        description="Wrap text prompts in the tokenizer's chat template as a user turn, with the "
        "generation prompt (instruct models). Prompts given as chat messages always use it.",
    )
    system_prompt: str | None = Field(
        None, description="System message put first in templated prompts that have none of their own."
    )
    max_prompt_len: int | None = Field(
        None,
        ge=1,
        description="Longest prompt in tokens (after templating); longer ones per overlong_prompt.",
    )
    overlong_prompt: Literal["drop", "truncate_left", "error"] = Field(
        "drop",
        description="A prompt over max_prompt_len: `drop` it (counted in the metrics as "
        "prompts_dropped), keep its last max_prompt_len tokens, or stop the run.",
    )
    reward: str = Field(
        "exact_match",
        description="A registered reward (exact_match, prefix_match, char_match, contains, numeric_match, gsm8k, "
        "boxed_math, normalized_exact_match, f1), `module:function` (the module importable by the flow "
        "and the Ray workers), `path/to/file.py:function`, or `http(s)://...` (a reward service, see "
        "remote_reward). Signature (prompt, response, label, **kw) -> float, async allowed; functions "
        "marked @group_reward/@batch_reward take lists (prompts, responses, labels) -> rewards.",
    )
    remote_reward: RemoteRewardConfig = Field(
        default_factory=RemoteRewardConfig, description="Batching and retries of an HTTP reward service."
    )
    reward_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest one reward call may take; a sample whose reward runs longer is marked failed.",
    )
    reward_isolation: Literal["process", "thread"] = Field(
        "process",
        description="Where a plug-in reward (`module:function`, `file.py:function`) runs: in `process`es, "
        "so that a call past reward_timeout_s is stopped (its process killed) and a crash fails only its "
        "samples; or in `thread`s of the rollout manager, with no process start or argument copying, "
        "where a timed-out call keeps running until the run ends. Built-in and async rewards run in threads.",
    )
    reward_workers: int = Field(
        2, ge=1, le=256, description="Processes that run a plug-in reward when reward_isolation is `process`."
    )
    max_failed_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Stop the run with an error when more than this share of a rollout's samples "
        "failed (reward raised, timed out or returned no finite number or one beyond +-1e6), instead of training on zeros.",
    )


# verl's ppo_max_token_len_per_gpu default: the micro-batch budget when none is set
DEFAULT_MICRO_BATCH_TOKENS = 16384


class AlgorithmConfig(_SeededSection):
    seed_field: ClassVar[str] = "seed"
    seed_offset: ClassVar[int] = 42

    lr: float = Field(5e-3, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas, each in [0, 1).")
    warmup_steps: int = Field(0, ge=0, description="Linear LR warm-up, in optimizer steps.")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "cosine",
        description="LR after the warm-up: `constant`, or `linear`/`cosine` decay to lr x min_lr_ratio at "
        "the run's last optimizer step (num_rollout x steps per rollout x ppo_epochs).",
    )
    min_lr_ratio: float = Field(
        0.1, ge=0, le=1, description="Final LR of a linear/cosine decay, as a fraction of lr."
    )
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm.")
    global_batch_size: int | None = Field(
        None,
        ge=1,
        description="Samples per optimizer step; default: the whole rollout (one step per iteration). "
        "With one step per iteration and ppo_epochs 1 (and no KL in the reward), the loss's forward also "
        "gives the old logprobs; more steps add a no-grad forward of the rollout for them.",
    )
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        description="Samples per forward/backward on one rank. Empty: micro-batches by token budget "
        f"(micro_batch_tokens, or {DEFAULT_MICRO_BATCH_TOKENS} padded tokens when that is empty too).",
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=2,
        description="Form micro-batches by a token budget (verl: use_dynamic_bsz with "
        "ppo_max_token_len_per_gpu): each rank packs the step's samples, sorted by length, while rows x "
        "longest row (prompt + response, padded) stays within this many tokens; a longer sample runs "
        "alone. Ranks get equal sample counts of near-equal tokens and the same number of micro-batches. "
        "The loss and gradients equal the sample-count path's. Set, it wins over micro_batch_size; with "
        f"both empty the budget is {DEFAULT_MICRO_BATCH_TOKENS} (verl's default), which puts the demo's whole step in one "
        "micro-batch per rank.",
    )
    shared_prompt_forward: bool = Field(
        True,
        description="In the trainer's forward, run each prompt once for the samples of it in a "
        "micro-batch, its responses packed behind it (an attention mask keeps them apart), where that "
        "cuts the padded tokens by a quarter or more in rows of at most 2048 tokens: GRPO's n samples "
        "of a prompt share its forward. The logits and gradients equal the one-row-per-sample forward's "
        "(up to float rounding). false: one row per sample always.",
    )
    ppo_epochs: int = Field(
        1, ge=1, description="Passes over each rollout; each pass takes one optimizer step per global batch."
    )
    advantage_estimator: Literal[
        "grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gspo", "ppo"
    ] = Field(
        "grpo",
        description="`grpo`: group-centred rewards (/ group std if normalize_advantage_std). `dr_grpo`: "
        "group-centred, no std, length-normalised loss. `rloo`: leave-one-out baseline. "
        "`reinforce_plus_plus`: rewards whitened over the batch's tokens; `_baseline`: group-centred "
        "first. `gspo`: GRPO advantages with a sequence-level ratio. `ppo`: per-token GAE "
        "advantages (gamma, lam) from a value critic (needs critic.enabled).",
    )
    gamma: float = Field(
        1.0, ge=0, le=1, description="ppo: discount of GAE (the reward sits on the last response token)."
    )
    lam: float = Field(1.0, ge=0, le=1, description="ppo: lambda of GAE (1: returns minus values).")
    normalize_advantage_std: bool = Field(
        True, description="grpo/gspo: divide group-centred rewards by the group std (+1e-6)."
    )
    unbiased_std: bool = Field(True, description="grpo/gspo: the group std divides by n - 1 (false: by n).")
    loss_agg_mode: (
        Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] | None
    ) = Field(
        None,
        description="How token losses of a global batch become one number: `token-mean` (over all its "
        "tokens), `seq-mean-token-mean`, `seq-mean-token-sum`, `seq-mean-token-sum-norm` (token sums / "
        "max_new_tokens, averaged over sequences). Empty: seq-mean-token-mean for gspo, "
        "seq-mean-token-sum-norm for dr_grpo, token-mean otherwise.",
    )
    eps_clip: float = Field(0.2, gt=0, description="PPO ratio clip (lower side).")
    eps_clip_high: float | None = Field(
        None, gt=0, description="PPO ratio clip (upper side); default: eps_clip."
    )
    clip_ratio_c: float | None = Field(
        3.0,
        gt=1,
        description="Dual clip: for negative advantages the loss is capped at -A x clip_ratio_c. "
        "Empty: no dual clip.",
    )
    kl_coef: float = Field(
        0.0, ge=0, description="Weight of the KL to a frozen reference model; 0 loads no reference."
    )
    kl_type: Literal["k1", "k2", "k3", "low_var_kl"] = Field(
        "k3",
        description="KL estimator per token: k1 = logp - ref, k2 = (logp - ref)^2 / 2, k3 = low_var_kl = "
        "exp(ref - logp) - (ref - logp) - 1 (log-ratio clamped to +-20, result to +-10).",
    )
    kl_in_reward: bool = Field(
        False,
        description="Apply the KL as a penalty on the reward (reward - kl_coef x summed KL, before the "
        "advantages) instead of as a loss term.",
    )
    entropy_coef: float = Field(0.0, ge=0, description="Weight of the entropy bonus.")
    tis: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Truncated importance sampling: weight each token's policy loss by "
        "min(exp(old logp - engine logp), tis_cap). `auto`: on in async mode, off in sync mode.",
    )
    tis_cap: float = Field(2.0, gt=0, description="Upper bound of the TIS weight.")
    seed: int | None = Field(
        None,
        ge=0,
        description="Seed of the trainer (model init is the model's own). Empty: derived from the run's "
        "`seed` (seed + 42).",
    )

    @property
    def token_budget(self) -> int | None:
        """Padded tokens per micro-batch, or None for micro-batches of micro_batch_size samples."""
        if self.micro_batch_tokens is not None:
            return self.micro_batch_tokens
        return DEFAULT_MICRO_BATCH_TOKENS if self.micro_batch_size is None else None

    @property
    def agg_mode(self) -> str:
        """`loss_agg_mode`, or the estimator's own when it is empty."""
        if self.loss_agg_mode:
            return self.loss_agg_mode
        return {"gspo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm"}.get(
            self.advantage_estimator, "token-mean"
        )

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in value):
            raise ValueError(f"algorithm.betas={list(value)}: each must lie in [0, 1) (AdamW)")
        return value

    @model_validator(mode="after")
    def _coherent(self) -> AlgorithmConfig:
        est = self.advantage_estimator
        if est == "gspo" and self.agg_mode != "seq-mean-token-mean":
            raise ValueError(
                f"algorithm.loss_agg_mode={self.loss_agg_mode}: gspo's ratio is one per sequence and its "
                "objective a mean over sequences; use seq-mean-token-mean (or leave it empty)"
            )
        if self.kl_in_reward and self.kl_coef == 0:
            raise ValueError("algorithm.kl_in_reward needs algorithm.kl_coef > 0")
        return self


class SFTConfig(_SeededSection):
    """Supervised fine-tuning on labelled (prompt, answer) rows: the warm start that
    `python -m flows.pipeline` runs on the trainer ranks before RL (docs/SFT.md)."""

    seed_field: ClassVar[str] = "seed"
    seed_offset: ClassVar[int] = 0

    data_path: str | None = Field(
        None,
        description="Labelled rows: jsonl, json or parquet (local or s3://) with the prompt in column "
        "data.prompt_key and the answer in sft.answer_key, or `builtin:<task>` (the task's labelled split: "
        "its train prompts with their answers, none of its eval prompts). Empty: the built-in task of "
        "data.train_path.",
    )
    answer_key: str = Field("label", description="Column holding the answer, the response trained on.")
    append_eos: bool = Field(
        True,
        description="End every answer with the tokenizer's end-of-sequence token, so the model learns "
        "to stop where the answer ends.",
    )
    epochs: int = Field(3, ge=1, description="Passes over the labelled rows, each in a new shuffled order.")
    batch_size: int = Field(
        16,
        ge=1,
        description="Examples per optimizer step, over all trainer ranks (divisible by their number); "
        "each epoch takes rows // batch_size steps, and the rows left over wait for the next epoch's order.",
    )
    micro_batch_size: int = Field(16, ge=1, description="Examples per forward/backward on one rank.")
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas, each in [0, 1).")
    warmup_steps: int = Field(0, ge=0, description="Linear LR warm-up, in optimizer steps.")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "cosine",
        description="LR after the warm-up: `constant`, or `linear`/`cosine` decay to lr x min_lr_ratio at "
        "the last step (epochs x steps per epoch).",
    )
    min_lr_ratio: float = Field(
        0.1, ge=0, le=1, description="Final LR of a linear/cosine decay, as a fraction of lr."
    )
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm.")
    seed: int | None = Field(
        None,
        ge=0,
        description="Seed of the epochs' shuffled orders and of the trainer. Empty: derived from the run's "
        "`seed` (equal to it).",
    )

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in value):
            raise ValueError(f"sft.betas={list(value)}: each must lie in [0, 1) (AdamW)")
        return value


class CriticConfig(_Section):
    """The value model of PPO: a scalar head on the policy's transformer, trained by its own ranks."""

    enabled: bool = Field(
        False,
        description="Train a value critic (needed by algorithm.advantage_estimator=ppo, used by no other "
        "estimator).",
    )
    model_path: str | None = Field(
        None,
        description="HF model directory (local or s3://) the critic starts from; its score head is always "
        "initialised fresh. Empty: the policy's model (model.path).",
    )
    lr: float = Field(5e-3, gt=0, description="AdamW learning rate of the critic.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay of the critic.")
    warmup_steps: int = Field(0, ge=0, description="Linear LR warm-up of the critic, in optimizer steps.")
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm of the critic.")
    cliprange_value: float = Field(
        0.5,
        gt=0,
        description="Value clip: the new value may move at most this far from the rollout-time value "
        "before the loss takes the clipped error (verl's cliprange_value).",
    )


class WeightSyncConfig(_Section):
    method: Literal["broadcast", "disk"] = Field(
        "broadcast",
        description="`broadcast`: trainer rank 0 broadcasts over a weight-update group with every engine "
        "rank (gloo on CPU, nccl on GPU), in the engines' dtype. `disk`: the trainer exports an HF directory "
        "per version to the run's storage (local or s3://); each engine's actor copies it to its node and "
        "loads it with /update_weights_from_disk; older versions are deleted.",
    )
    bucket_size_mb: float = Field(
        64,
        gt=0,
        description="Parameters gathered and sent per bucket, in MiB. Rank 0 gathers the next bucket "
        "while one is broadcast, so it holds two buckets at once.",
    )
    flattened_buckets: bool = Field(
        True,
        description="`broadcast` only: send each bucket as one flat byte buffer (SGLang's "
        "`load_format=flattened_bucket` on /update_weights_from_distributed; one collective per bucket) "
        "instead of one broadcast per tensor. Turn off for SGLang servers older than that option.",
    )
    check_weight_update_equal: bool = Field(
        False,
        description="After each sync, compare the leading 100 rows of every tensor (what /get_weights_by_name "
        "returns) on every engine with the trainer's, in the engine's dtype; report the real max_abs_diff "
        "and fail naming the tensor and engine on a mismatch. Few SGLang model classes implement "
        "/get_weights_by_name (Llama does).",
    )
    lora: Literal["merged", "adapter"] = Field(
        "merged",
        description="With `model.lora`: `merged` sends full weights with the adapter merged in "
        "(W + alpha/r * B @ A) through `method`, so any engine serves them unchanged. `adapter` sends "
        "only the adapter: the trainer writes a PEFT adapter directory per version to the run's storage, "
        "every engine loads it under a new name (`/load_lora_adapter`; launched with LoRA enabled), "
        "rollout requests name it (`lora_path`), and the previous version is unloaded.",
    )
    timeout_s: float = Field(
        120,
        gt=0,
        description="Longest wait of one weight-sync step: forming the weight-update group, one broadcast, "
        "one HTTP request to an engine. A dead engine fails the sync within it, naming the engine's URL.",
    )


class StorageConfig(_Section):
    uri: str = Field(
        "runs", description="Where runs live: a local folder (`.` for the current one) or s3://bucket/prefix."
    )
    endpoint_url: str | None = Field(None, description="S3 endpoint (else AWS_ENDPOINT_URL or AWS default).")
    region: str | None = Field(None, description="S3 region (else AWS_REGION / AWS_DEFAULT_REGION).")
    profile: str | None = Field(
        None, description="AWS profile name. Credentials come only from the environment."
    )
    retry_timeout_s: float = Field(
        60.0,
        ge=0,
        description="How long one storage operation is retried (with backoff) while the endpoint is "
        "unreachable or erroring, before the run fails. 0: one attempt, no retries.",
    )

    @field_validator("uri")
    @classmethod
    def _uri_named(cls, value: str) -> str:
        # an empty URI would silently put the runs into whatever directory the flow started in
        if not value.strip():
            raise ValueError(
                "storage.uri is empty: name a local folder (`.` for the current one) or s3://..."
            )
        return value


class CheckpointConfig(_Section):
    save_interval: int | None = Field(
        10, ge=1, description="Save every N iterations (and at epoch ends and the end)."
    )
    keep_last: int | None = Field(2, ge=1, description="Complete checkpoints kept; older ones are deleted.")
    hf_export_interval: int | None = Field(
        None,
        ge=1,
        description="Export an HF model directory every N iterations (always at the end); with "
        "`model.lora`, a PEFT adapter directory.",
    )
    resume: str = Field(
        "never",
        description="`never`: start at iteration 0, and refuse a run folder that already holds outputs. "
        "`fresh`: delete the run folder's old outputs first, then start at 0. `auto`: continue from the "
        "latest complete checkpoint (iteration 0 if none). Or the URI of one checkpoint folder.",
    )

    @model_validator(mode="after")
    def _resume_spec(self) -> CheckpointConfig:
        spec = self.resume
        if spec not in RESUME_MODES and "/" not in spec:
            raise ValueError(
                f"checkpoint.resume: {spec!r} is none of {', '.join(RESUME_MODES)} and not a checkpoint URI"
            )
        return self


class EvalDataset(_Section):
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
        description="Short name; metrics are reported as `eval_<name>_reward_mean`, `eval_<name>_pass@k`.",
    )
    path: str = Field(description="jsonl/parquet (local or s3://) or `builtin:<task>` (its eval split).")
    num_prompts: int | None = Field(
        None,
        ge=1,
        description="Prompts per evaluation, sampled as eval.num_prompts' are; default: eval.num_prompts.",
    )
    n_samples: int | None = Field(None, ge=1, description="Samples per prompt; default: eval.n_samples.")
    temperature: float | None = Field(
        None,
        ge=0,
        description=f"Sampling temperature (0: greedy, else at least {MIN_TEMPERATURE:g}); default: "
        "eval.temperature.",
    )
    max_new_tokens: int | None = Field(
        None, ge=1, description="Longest response; default: rollout.sampling.max_new_tokens."
    )
    reward: str | None = Field(None, description="Reward of this set (as data.reward); default: data.reward.")

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value: float | None) -> float | None:
        return _greedy_or_tempered(value, "eval.datasets[].temperature")


class EvalConfig(_Section):
    interval: int | None = Field(
        10, ge=1, description="Evaluate every N iterations (and at epoch ends); empty: never."
    )
    num_prompts: int = Field(
        64,
        ge=1,
        description="Held-out prompts per evaluation: a sample of the eval data drawn with data.shuffle_seed, "
        "the same prompts at every evaluation of a run (all of them, in order, when the data holds no "
        "more).",
    )
    n_samples: int = Field(4, ge=1, description="Samples per eval prompt (pass@k uses k <= n_samples).")
    temperature: float = Field(
        0.6, ge=0, description=f"Eval sampling temperature (0: greedy, else at least {MIN_TEMPERATURE:g})."
    )
    pass_k: list[int] = Field(default_factory=lambda: [1, 4], description="k values of the reported pass@k.")
    datasets: list[EvalDataset] = Field(
        default_factory=list,
        description="Several eval sets, each with its own settings and metrics. Empty: one set, the eval "
        "prompts of data.eval_path (see there: a held-out split when it is empty), reported as "
        "eval_reward_mean / eval_pass@k.",
    )

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value: float) -> float:
        return _greedy_or_tempered(value, "eval.temperature")

    @model_validator(mode="after")
    def _k_fits(self) -> EvalConfig:
        for where, n in [("eval.n_samples", self.n_samples)] + [
            (f"eval.datasets[{d.name}].n_samples", d.n_samples) for d in self.datasets if d.n_samples
        ]:
            bad = [k for k in self.pass_k if k < 1 or k > n]
            if bad:
                raise ValueError(f"eval.pass_k: {bad} must lie in 1..{where}={n}")
        names = [d.name for d in self.datasets]
        if len(set(names)) != len(names):
            raise ValueError(f"eval.datasets: names must be unique, got {names}")
        return self


class TrackingConfig(_Section):
    backends: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list,
        description="Experiment trackers that also receive every metrics row; none by default "
        "(metrics.jsonl and the Prefect artifacts are always written).",
    )
    project: str | None = Field(
        None, description="wandb project / MLflow experiment name; default: the run name."
    )
    dir: str | None = Field(
        None,
        description="Local folder for wandb files and the default MLflow store; default: "
        "`<run>/tracking` for local runs, `./tracking` for S3 runs.",
    )
    mlflow_uri: str | None = Field(
        None, description="MLflow tracking URI; default: MLFLOW_TRACKING_URI, else a sqlite file in `dir`."
    )


class MonitorConfig(_Section):
    """When the flow run logs a warning that learning has stalled (both conditions read the
    metrics `stuck_group_frac` and `entropy`; a warning repeats only after its condition cleared)."""

    stuck_group_frac: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Warn that most prompts give no learning signal when at least this share of prompt "
        "groups is stuck (every sample of the prompt got the same reward, below the rollout's best) for "
        "`patience` iterations in a row: e.g. the task is too hard for the policy; more samples per "
        "prompt or rollout.dynamic_sampling help.",
    )
    patience: int = Field(
        10, ge=1, description="Iterations in a row the no-signal condition must hold before the warning."
    )
    entropy_floor: float = Field(
        0.1,
        ge=0,
        description="Warn that the policy collapsed when its mean token entropy falls below this (nats) "
        "while at least `collapse_stuck_frac` of the groups are stuck: it answers deterministically and "
        "wrong there, which GRPO cannot correct. 0: never.",
    )
    collapse_stuck_frac: float = Field(
        0.1, gt=0, le=1, description="Share of stuck groups that, below `entropy_floor`, is a collapse."
    )


class RunConfig(_Section):
    """A whole training run: the loop, its parts and where its state lives."""

    run_name: str = Field(
        "tiny-demo",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Folder of this run under storage.uri.",
    )
    mode: Literal["async", "sync"] = Field(
        "async",
        description="`async`: generate k+1 while training k (one step off-policy). `sync`: no overlap.",
    )
    num_rollout: int = Field(40, ge=1, description="Iterations (rollout, train, sync) to run in total.")
    iterations_per_run: int | None = Field(
        None,
        ge=1,
        description="Stop this flow run after N iterations (checkpointed); with checkpoint.resume=auto the next "
        "run continues (a nightly schedule). Empty: run to num_rollout.",
    )
    update_weights_interval: int = Field(
        1, ge=1, description="Push trainer weights to the engines every N iterations."
    )
    num_critic_only_steps: int = Field(0, ge=0, description="Leading iterations that train only the critic.")
    seed: int = Field(
        0,
        ge=0,
        lt=SEED_LIMIT,
        description="Seed of the whole run: the seeds left empty derive from it, each as (seed + offset) "
        "mod 2^22: model.tiny.seed (+0), sft.seed (+0), data.shuffle_seed (+7), algorithm.seed (+42), "
        "rollout.seed (+1234). The same seed and config repeat a run exactly (with the built-in engine).",
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy model.")
    cluster: ClusterConfig = Field(
        default_factory=ClusterConfig, description="Ray cluster and resources per role."
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Rollout engines and sampling.")
    data: DataConfig = Field(default_factory=DataConfig, description="Prompts and rewards.")
    algorithm: AlgorithmConfig = Field(
        default_factory=AlgorithmConfig, description="GRPO / PPO-clip training."
    )
    critic: CriticConfig = Field(default_factory=CriticConfig, description="Value critic (PPO).")
    weight_sync: WeightSyncConfig = Field(
        default_factory=WeightSyncConfig, description="Trainer-to-engine weights."
    )
    storage: StorageConfig = Field(default_factory=StorageConfig, description="Object storage of the run.")
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoints and resume."
    )
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    sft: SFTConfig = Field(
        default_factory=SFTConfig,
        description="Supervised warm start before RL (`python -m flows.pipeline`; `flows.train` ignores it).",
    )
    tracking: TrackingConfig = Field(
        default_factory=TrackingConfig, description="TensorBoard, wandb or MLflow logging of metrics."
    )
    monitor: MonitorConfig = Field(
        default_factory=MonitorConfig, description="Warnings in the flow run's log when learning stalls."
    )

    @property
    def holds_out_eval(self) -> bool:
        """The default eval set is a held-out split of data.train_path's rows (see data.eval_path)."""
        d = self.data
        return d.eval_path is None and not d.train_path.startswith("builtin:") and not self.eval.datasets

    @property
    def rollout_samples(self) -> int:
        return self.rollout.prompts_per_rollout * self.rollout.n_samples_per_prompt

    @property
    def global_batch_size(self) -> int:
        return self.algorithm.global_batch_size or self.rollout_samples

    @property
    def tis_enabled(self) -> bool:
        """Truncated importance sampling on the engine logprobs (`auto`: only in async mode)."""
        tis = self.algorithm.tis
        return tis == "on" or (tis == "auto" and self.mode == "async")

    @property
    def total_optimizer_steps(self) -> int:
        """Optimizer steps of the whole run (the LR schedule's horizon)."""
        per_rollout = self.rollout_samples // self.global_batch_size
        return self.num_rollout * per_rollout * self.algorithm.ppo_epochs

    @model_validator(mode="after")
    def _derive_seeds(self) -> RunConfig:
        tiny = self.model.tiny.with_run_seed(self.seed)
        if tiny is not self.model.tiny:
            self.model = self.model.model_copy(update={"tiny": tiny})
        self.rollout = self.rollout.with_run_seed(self.seed)
        self.data = self.data.with_run_seed(self.seed)
        self.algorithm = self.algorithm.with_run_seed(self.seed)
        self.sft = self.sft.with_run_seed(self.seed)
        return self

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        ranks = self.cluster.trainer.num_workers
        if self.rollout_samples % self.global_batch_size:
            raise ValueError(
                f"algorithm.global_batch_size={self.global_batch_size} must divide the rollout's "
                f"{self.rollout_samples} samples (prompts_per_rollout x n_samples_per_prompt)"
            )
        if self.global_batch_size % ranks:
            raise ValueError(
                f"algorithm.global_batch_size={self.global_batch_size} must be divisible by "
                f"cluster.trainer.num_workers={ranks}"
            )
        if self.num_critic_only_steps and not self.critic.enabled:
            raise ValueError("num_critic_only_steps > 0 needs a critic (critic.enabled)")
        est = self.algorithm.advantage_estimator
        if est == "ppo" and not self.critic.enabled:
            raise ValueError("algorithm.advantage_estimator=ppo needs a value critic: set critic.enabled")
        if self.critic.enabled and est != "ppo":
            raise ValueError(
                f"critic.enabled with algorithm.advantage_estimator={est}: only ppo uses the critic's "
                "values; set advantage_estimator=ppo or critic.enabled=false"
            )
        if self.critic.enabled and self.global_batch_size % self.cluster.critic.num_workers:
            raise ValueError(
                f"algorithm.global_batch_size={self.global_batch_size} must be divisible by "
                f"cluster.critic.num_workers={self.cluster.critic.num_workers}"
            )
        self._check_groups()
        if self.num_critic_only_steps >= self.num_rollout:
            raise ValueError("num_critic_only_steps must be smaller than num_rollout")
        tp = self.rollout.tp_size
        if self.rollout.engine == "torch" and tp != 1:
            raise ValueError(
                f"rollout.tp_size={tp}: the built-in torch engine has no tensor parallelism; use 1"
            )
        gpus = self.cluster.engines.gpus_per_worker
        if self.rollout.engine == "sglang" and gpus and gpus != tp:
            raise ValueError(
                f"cluster.engines.gpus_per_worker={self.cluster.engines.gpus_per_worker} must equal "
                f"rollout.tp_size={tp}: one engine process spans its tensor-parallel GPUs"
            )
        if self.rollout.engine != "sglang":
            for name in ("sglang_python", "sglang_sleep_on_idle"):
                if getattr(self.rollout, name) not in ("", None):
                    raise ValueError(f"rollout.{name} applies to rollout.engine=sglang only")
        if self.cluster.colocate:
            self._check_colocation()
        if self.rollout.engine_urls:
            self._check_attached_engines()
        self._check_lora()
        self._check_over_sampling()
        return self

    def _check_groups(self) -> None:
        """What compares the samples of a prompt needs two of them at least."""
        est = self.algorithm.advantage_estimator
        grouped = ("grpo", "dr_grpo", "gspo", "rloo", "reinforce_plus_plus_baseline")
        if est in grouped and self.rollout.n_samples_per_prompt < 2:
            raise ValueError(
                f"algorithm.advantage_estimator={est} compares the samples of a prompt: "
                "rollout.n_samples_per_prompt must be >= 2"
            )
        if self.rollout.dynamic_sampling and self.rollout.n_samples_per_prompt < 2:
            raise ValueError(
                "rollout.dynamic_sampling (on by default) keeps groups whose samples score differently: it "
                "needs rollout.n_samples_per_prompt >= 2; set rollout.dynamic_sampling=false for one sample "
                "per prompt"
            )

    @model_validator(mode="after")
    def _sft_batch_fits_ranks(self) -> RunConfig:
        ranks = self.cluster.trainer.num_workers
        if self.sft.batch_size % ranks:
            raise ValueError(
                f"sft.batch_size={self.sft.batch_size} must be divisible by cluster.trainer.num_workers={ranks}"
            )
        return self

    def _check_over_sampling(self) -> None:
        if self.rollout.over_sample_prompts and self.rollout.generate_fn is not None:
            raise ValueError(
                "rollout.over_sample_prompts with rollout.generate_fn: a custom rollout function's "
                "requests cannot be aborted by the manager; set rollout.over_sample_prompts to 0"
            )

    def _check_lora(self) -> None:
        if self.weight_sync.lora == "adapter" and self.model.lora is None:
            raise ValueError(
                "weight_sync.lora=adapter sends a LoRA adapter: set model.lora (or weight_sync.lora=merged)"
            )
        unserved = (
            sorted(set(self.model.lora.target_modules) - set(BUILTIN_LORA_TARGETS)) if self.model.lora else []
        )
        if self.weight_sync.lora == "adapter" and self.rollout.engine == "torch" and unserved:
            raise ValueError(
                f"model.lora.target_modules: the built-in engine applies adapters to "
                f"{list(BUILTIN_LORA_TARGETS)} only, not {unserved}; use weight_sync.lora=merged"
            )
        if self.weight_sync.lora == "adapter" and self.rollout.generate_fn is not None:
            raise ValueError(
                "weight_sync.lora=adapter with rollout.generate_fn: a custom rollout function sends its "
                "own requests, which would not name the adapter; use weight_sync.lora=merged"
            )

    def _check_attached_engines(self) -> None:
        """rollout.engine_urls: what needs the engines' actors, which attached engines lack."""
        if self.cluster.colocate:
            raise ValueError(
                "rollout.engine_urls with cluster.colocate: attached engines do not share the "
                "trainer's bundles (nothing here can release their memory)"
            )
        if self.weight_sync.method != "broadcast":
            raise ValueError(
                "rollout.engine_urls needs weight_sync.method=broadcast: disk sync loads the "
                "export through each engine's actor, and attached engines have none"
            )
        if self.model.lora is not None and self.weight_sync.lora == "adapter":
            raise ValueError(
                "rollout.engine_urls with weight_sync.lora=adapter: adapters load through the "
                "engines' actors, which attached engines lack; use weight_sync.lora=merged"
            )

    def _check_colocation(self) -> None:
        trainer, engines = self.cluster.trainer, self.cluster.engines
        if self.mode == "async":
            raise ValueError(
                "cluster.colocate=true needs mode=sync: in async mode generation of k+1 runs while the "
                "trainer trains on k, so engines and trainer cannot take turns on the same devices"
            )
        if engines.num_workers > trainer.num_workers:
            raise ValueError(
                f"cluster.colocate: cluster.engines.num_workers={engines.num_workers} must not exceed "
                f"cluster.trainer.num_workers={trainer.num_workers} (engines share the trainer's bundles)"
            )
        if self.rollout.tp_size != 1:
            raise ValueError(
                f"cluster.colocate: rollout.tp_size={self.rollout.tp_size} is not supported colocated; "
                "a colocated engine shares one trainer bundle (one GPU), so use rollout.tp_size=1"
            )
        if self.critic.enabled:
            raise ValueError(
                "cluster.colocate with critic.enabled: colocation shares the trainer's devices with the "
                "engines only; the critic's ranks need their own (set cluster.colocate=false)"
            )
        if trainer.gpus_per_worker and self.weight_sync.method == "broadcast":
            raise ValueError(
                "cluster.colocate on GPUs needs weight_sync.method=disk: engine 0 shares trainer rank 0's "
                "GPU, and NCCL refuses two ranks of one group (the weight-update group) on the same GPU"
            )
        if engines.gpus_per_worker and engines.gpus_per_worker != trainer.gpus_per_worker:
            raise ValueError(
                f"cluster.colocate: cluster.engines.gpus_per_worker={engines.gpus_per_worker} must equal "
                f"cluster.trainer.gpus_per_worker={trainer.gpus_per_worker}: an engine shares a trainer "
                "bundle's GPUs"
            )
