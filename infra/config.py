"""The one config tree of a training run.

It is the `train` flow's only parameter, so the Prefect UI renders it as a form: every
field carries a description and a default that runs the tiny CPU demo. This module must
stay importable without torch or ray (the Prefect UI, deployments and tests parse it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

RESUME_MODES = ("never", "fresh", "auto")


class _Section(BaseModel):
    # Unknown keys are typos: reject them instead of silently ignoring a setting.
    model_config = ConfigDict(extra="forbid")


class TinyModelConfig(_Section):
    """Shape of the built-in tiny Llama model (used when `model.path` is `builtin:tiny-llama`)."""

    hidden_size: int = Field(64, ge=8, description="Width of the residual stream.")
    num_layers: int = Field(2, ge=1, description="Number of decoder layers.")
    num_heads: int = Field(4, ge=1, description="Attention heads per layer.")
    intermediate_size: int = Field(256, ge=8, description="Width of the MLP.")
    max_position_embeddings: int = Field(64, ge=8, description="Longest prompt plus response, in tokens.")
    seed: int = Field(0, description="Seed of the random initialisation.")


class ModelConfig(_Section):
    path: str = Field(
        "builtin:tiny-llama",
        description="HF model directory (local path or s3://...) loaded with from_pretrained. "
        "`builtin:tiny-llama` builds a tiny Llama with a character tokenizer under the run "
        "folder on first use.",
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Shape of the built-in model.")


class RoleResources(_Section):
    num_workers: int = Field(1, ge=1, description="Processes in this role (trainer ranks or engines).")
    cpus_per_worker: float = Field(1.0, ge=0, description="Ray CPUs reserved per process.")
    gpus_per_worker: float = Field(
        0.0, ge=0, description="Ray GPUs reserved per process (0 on CPU machines)."
    )


class ClusterConfig(_Section):
    ray_address: str = Field(
        "",
        description="Empty: start a local Ray cluster. `auto` or `ray://host:port`: join an existing one.",
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
    engines: RoleResources = Field(default_factory=RoleResources, description="Rollout engine servers.")
    threads_per_worker: int = Field(
        1,
        ge=1,
        description="torch/OMP threads per trainer rank and engine; 1 avoids thrashing on small machines.",
    )


class SamplingConfig(_Section):
    temperature: float = Field(
        1.0, gt=0, description="Sampling temperature; logprobs are taken at this temperature."
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(-1, description="Keep the k most likely tokens; -1 keeps all.")
    max_new_tokens: int = Field(1, ge=1, description="Longest response, in tokens.")
    stop: list[str] = Field(
        default_factory=lambda: ["\n"], description="Strings (single tokens) that end a response."
    )


class RolloutConfig(_Section):
    engine: Literal["torch", "sglang"] = Field(
        "torch", description="`torch`: the built-in CPU/GPU server. `sglang`: SGLang servers (GPU only)."
    )
    tp_size: int = Field(
        1,
        ge=1,
        description="Tensor-parallel GPUs per engine (SGLang `--tp-size`); an engine takes tp_size ranks "
        "of the weight-update group (rank_offset + tp_rank). The built-in engine runs with 1.",
    )
    prompts_per_rollout: int = Field(64, ge=1, description="Prompts drawn per iteration.")
    n_samples_per_prompt: int = Field(16, ge=1, description="Responses per prompt (the GRPO group size).")
    sampling: SamplingConfig = Field(
        default_factory=SamplingConfig, description="Sampling of training rollouts."
    )
    seed: int = Field(1234, description="Base seed of sampling; each rollout derives its own.")
    startup_timeout_s: float = Field(120, gt=0, description="How long an engine may take to answer /health.")
    request_timeout_s: float = Field(600, gt=0, description="Timeout of one HTTP request to an engine.")
    sglang_args: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Extra `sglang.launch_server` flags (engine=sglang only)."
    )


class DataConfig(_Section):
    train_path: str = Field(
        "builtin:digit-copy",
        description="Training prompts: jsonl or parquet (local or s3://), or `builtin:<task>`.",
    )
    eval_path: str = Field(
        "builtin:digit-copy",
        description="Evaluation prompts, same formats. `builtin:digit-add` holds out prompts it never "
        "trains on; `builtin:digit-copy` has too few and evaluates on its training prompts.",
    )
    prompt_key: str = Field("prompt", description="Column holding the prompt text.")
    label_key: str = Field("label", description="Column holding the reference answer.")
    shuffle_seed: int = Field(7, description="Seed of the per-epoch prompt shuffle.")
    reward: str = Field(
        "exact_match",
        description="A registered reward (exact_match, prefix_match, contains, numeric_match), "
        "`module:function` (the module importable by the flow and the Ray workers), or "
        "`path/to/file.py:function`; signature (prompt, response, label, **kw) -> float; async allowed.",
    )
    reward_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest one reward call may take; a sample whose reward runs longer is marked failed.",
    )
    max_failed_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Stop the run with an error when more than this share of a rollout's samples "
        "failed (reward raised, timed out or returned no finite number), instead of training on zeros.",
    )


class AlgorithmConfig(_Section):
    lr: float = Field(5e-3, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas.")
    warmup_steps: int = Field(0, ge=0, description="Linear LR warm-up, in optimizer steps.")
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm.")
    global_batch_size: int | None = Field(
        None,
        ge=1,
        description="Samples per optimizer step; default: the whole rollout (one step per iteration).",
    )
    micro_batch_size: int = Field(32, ge=1, description="Samples per forward/backward on one rank.")
    eps_clip: float = Field(0.2, gt=0, description="PPO ratio clip (lower side).")
    eps_clip_high: float | None = Field(
        None, gt=0, description="PPO ratio clip (upper side); default: eps_clip."
    )
    kl_coef: float = Field(
        0.0, ge=0, description="Weight of the KL to a frozen reference model; 0 loads no reference."
    )
    entropy_coef: float = Field(0.0, ge=0, description="Weight of the entropy bonus.")
    normalize_advantage_std: bool = Field(
        True, description="GRPO: divide group-centred rewards by the group std."
    )
    seed: int = Field(42, description="Seed of the trainer (model init is the model's own).")


class CriticConfig(_Section):
    enabled: bool = Field(
        False, description="Train a value critic (PPO). Not available yet: GRPO needs none."
    )

    @model_validator(mode="after")
    def _not_yet(self) -> CriticConfig:
        if self.enabled:
            raise ValueError(
                "critic.enabled: the PPO critic is not implemented yet; use GRPO (enabled=false)"
            )
        return self


class WeightSyncConfig(_Section):
    method: Literal["broadcast", "disk"] = Field(
        "broadcast",
        description="`broadcast`: a weight-update group (gloo on CPU, nccl on GPU). "
        "`disk`: engines reload the HF export with /update_weights_from_disk.",
    )
    bucket_size_mb: float = Field(64, gt=0, description="Parameters gathered and sent per bucket, in MiB.")
    check_weight_update_equal: bool = Field(
        False,
        description="After each sync, compare every engine tensor with the trainer's and fail on mismatch.",
    )


class StorageConfig(_Section):
    uri: str = Field("runs", description="Where runs live: a local folder or s3://bucket/prefix.")
    endpoint_url: str | None = Field(None, description="S3 endpoint (else AWS_ENDPOINT_URL or AWS default).")
    region: str | None = Field(None, description="S3 region (else AWS_REGION / AWS_DEFAULT_REGION).")
    profile: str | None = Field(
        None, description="AWS profile name. Credentials come only from the environment."
    )
    retry_timeout_s: float = Field(
        60.0,
        ge=0,
        description="How long one storage operation is retried (with backoff) while the endpoint is "
        "unreachable or erroring, before the run fails.",
    )


class CheckpointConfig(_Section):
    save_interval: int | None = Field(
        10, ge=1, description="Save every N iterations (and at epoch ends and the end)."
    )
    keep_last: int | None = Field(2, ge=1, description="Complete checkpoints kept; older ones are deleted.")
    hf_export_interval: int | None = Field(
        None, ge=1, description="Export an HF model directory every N iterations (always at the end)."
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


class EvalConfig(_Section):
    interval: int | None = Field(
        10, ge=1, description="Evaluate every N iterations (and at epoch ends); empty: never."
    )
    num_prompts: int = Field(64, ge=1, description="Held-out prompts per evaluation.")
    n_samples: int = Field(4, ge=1, description="Samples per eval prompt (pass@k uses k <= n_samples).")
    temperature: float = Field(0.6, gt=0, description="Eval sampling temperature.")
    pass_k: list[int] = Field(default_factory=lambda: [1, 4], description="k values of the reported pass@k.")

    @model_validator(mode="after")
    def _k_fits(self) -> EvalConfig:
        bad = [k for k in self.pass_k if k < 1 or k > self.n_samples]
        if bad:
            raise ValueError(f"eval.pass_k: {bad} must lie in 1..n_samples={self.n_samples}")
        return self


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

    @property
    def rollout_samples(self) -> int:
        return self.rollout.prompts_per_rollout * self.rollout.n_samples_per_prompt

    @property
    def global_batch_size(self) -> int:
        return self.algorithm.global_batch_size or self.rollout_samples

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
        if self.num_critic_only_steps >= self.num_rollout:
            raise ValueError("num_critic_only_steps must be smaller than num_rollout")
        if self.rollout.engine == "sglang" and self.cluster.engines.gpus_per_worker <= 0:
            raise ValueError("rollout.engine=sglang needs cluster.engines.gpus_per_worker >= 1")
        tp = self.rollout.tp_size
        if self.rollout.engine == "torch" and tp != 1:
            raise ValueError(
                f"rollout.tp_size={tp}: the built-in torch engine has no tensor parallelism; use 1"
            )
        if self.rollout.engine == "sglang" and self.cluster.engines.gpus_per_worker != tp:
            raise ValueError(
                f"cluster.engines.gpus_per_worker={self.cluster.engines.gpus_per_worker} must equal "
                f"rollout.tp_size={tp}: one engine process spans its tensor-parallel GPUs"
            )
        return self
