"""verl 0.9.1's PPO functions, twice: transcribed, and verl's own where verl imports.

`Transcribed` writes out each function of verl 0.9.1 that tests/unit/test_verl_conventions.py
compares with (verl/trainer/ppo/core_algos.py, verl/utils/torch_functional.py,
ray_trainer.apply_kl_penalty, rollout_corr_helper.compute_rollout_correction_weights) in
plain torch, operation for operation. `Own` calls verl's own functions with the same
arguments; it exists only where `verl==0.9.1` imports, e.g. beside this venv:
`pip install --target DIR --no-deps verl==0.9.1 tensordict==0.10.0 pyvers omegaconf
antlr4-python3-runtime==4.9.3 hydra-core codetiming torchdata datasets dill xxhash multiprocess`,
then `PYTHONPATH=DIR pytest tests/unit/test_verl_conventions.py`. The tests run against
both, so a transcription that drifted from verl fails there.
"""

from __future__ import annotations

from collections import defaultdict

import torch

VERL_VERSION = "0.9.1"


def _masked_mean(values, mask, axis=None):
    return (torch.where(mask.bool(), values, 0.0) * mask).sum(axis) / (mask.sum(axis) + 1e-8)


def _masked_whiten(values, mask):
    mean = _masked_mean(values, mask)
    var = _masked_mean((values - mean) ** 2, mask) * mask.sum() / (mask.sum() - 1)
    return (values - mean) * torch.rsqrt(var + 1e-8)


def _group_stats(scores, index):
    groups = defaultdict(list)
    for i, g in enumerate(index):
        groups[g].append(scores[i])
    return {g: torch.stack(v) for g, v in groups.items()}


def _leave_one_out(score, group):
    n = len(group)
    return score * n / (n - 1) - group.mean() * n / (n - 1)


class Transcribed:
    name = "transcribed"

    @staticmethod
    def grpo(token_rewards, mask, index, norm: bool):
        scores = token_rewards.sum(-1)
        stats = {
            g: (torch.tensor(0.0), torch.tensor(1.0)) if len(v) == 1 else (v.mean(), v.std())
            for g, v in _group_stats(scores, index).items()
        }
        out = torch.stack(
            [
                (s - stats[g][0]) / (stats[g][1] + 1e-6) if norm else s - stats[g][0]
                for s, g in zip(scores, index, strict=True)
            ]
        )
        return out.unsqueeze(-1) * mask

    @staticmethod
    def rloo(token_rewards, mask, index):
        scores = token_rewards.sum(-1)
        groups = _group_stats(scores, index)
        out = torch.stack(
            [
                s if len(groups[g]) == 1 else _leave_one_out(s, groups[g])
                for s, g in zip(scores, index, strict=True)
            ]
        )
        return out.unsqueeze(-1) * mask

    @staticmethod
    def reinforce_pp(token_rewards, mask):
        # returns with gamma = 1; a token the environment wrote (mask 0) carries the return on
        returns = torch.zeros_like(token_rewards)
        running = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype)
        for t in reversed(range(token_rewards.shape[1])):
            new = token_rewards[:, t] + running
            returns[:, t] = new * mask[:, t]
            running = new * mask[:, t] + running * (1 - mask[:, t])
        return _masked_whiten(returns, mask) * mask

    @staticmethod
    def reinforce_pp_baseline(token_rewards, mask, index):
        scores = token_rewards.sum(-1)
        stats = _group_stats(scores, index)
        means = {g: (v.mean() if len(v) > 1 else torch.tensor(0.0)) for g, v in stats.items()}
        centred = torch.stack([scores[i] - means[g] for i, g in enumerate(index)])
        tiled = centred.unsqueeze(-1).tile([1, mask.shape[-1]]) * mask
        return _masked_whiten(tiled, mask) * mask

    @staticmethod
    def agg_loss(loss, mask, mode, global_batch_size=None, loss_scale_factor=None):
        if mode == "token-mean":
            return (loss * mask).sum() / mask.sum()
        seq_mask = (mask.sum(-1) > 0).to(loss.dtype)
        bsz = seq_mask.sum() if global_batch_size is None else global_batch_size
        if mode == "seq-mean-token-mean":
            seq = (loss * mask).sum(-1) / (mask.sum(-1) + 1e-8)
            return (seq * seq_mask).sum() / bsz
        out = ((loss * mask).sum(-1) * seq_mask).sum() / bsz
        if mode == "seq-mean-token-sum-norm":
            out = out / (mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return out

    @classmethod
    def vanilla(cls, old, logp, adv, mask, mode, low, high, c):
        neg_kl = torch.clamp(logp - old, -20.0, 20.0)
        ratio = torch.exp(neg_kl)
        l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - low, 1 + high)
        clip1 = torch.maximum(l1, l2)
        l3 = -adv * c
        loss = torch.where(adv < 0, torch.min(l3, clip1), clip1)
        return cls.agg_loss(loss, mask, mode), {
            "pg_clipfrac": _masked_mean(torch.gt(l2, l1).to(loss.dtype), mask).item(),
            "ppo_kl": _masked_mean(-neg_kl, mask).item(),
            "pg_clipfrac_lower": _masked_mean(torch.gt(clip1, l3) * (adv < 0).to(loss.dtype), mask).item(),
        }

    @classmethod
    def gspo(cls, old, logp, adv, mask, low, high):
        neg_kl = logp - old
        seq = (neg_kl * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        ratio = torch.exp(torch.clamp(logp - logp.detach() + seq.detach().unsqueeze(-1), max=10.0))
        loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - low, 1 + high))
        return cls.agg_loss(loss, mask, "seq-mean-token-mean"), {"ppo_kl": _masked_mean(-neg_kl, mask).item()}

    @staticmethod
    def value_loss(vpreds, returns, values, mask, clip):
        clipped = torch.max(torch.min(vpreds, values + clip), values - clip)  # clip_by_value
        e1, e2 = (vpreds - returns) ** 2, (clipped - returns) ** 2
        return 0.5 * Transcribed.agg_loss(torch.max(e1, e2), mask, "token-mean"), _masked_mean(
            torch.gt(e2, e1).to(vpreds.dtype), mask
        )

    @staticmethod
    def kl_penalty(logp, ref, kind):
        if kind in ("kl", "k1"):
            return logp - ref
        if kind in ("mse", "k2"):
            return 0.5 * (logp - ref).square()
        kl = torch.clamp(ref - logp, min=-20, max=20)
        return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)

    @classmethod
    def apply_kl_penalty(cls, mask, token_scores, old, ref, beta, kind):
        kld = cls.kl_penalty(old, ref, kind) * mask
        current = torch.mean(_masked_mean(kld, mask, axis=-1), dim=0).item()
        return token_scores - beta * kld, {"reward_kl_penalty": current, "reward_kl_penalty_coeff": beta}

    @staticmethod
    def token_is_weights(log_ratio, mask, threshold):  # rollout_is=token, rollout_is_threshold
        return (torch.exp(torch.clamp(log_ratio, -20.0, 20.0)) * mask).clamp(max=threshold)


class Own:
    """verl's own functions behind Transcribed's signatures."""

    name = "verl"

    def __init__(self) -> None:
        import verl  # noqa: F401 - raises ImportError where verl is absent
        import verl.trainer.ppo.core_algos as core
        from omegaconf import OmegaConf

        self.core, self.conf = core, OmegaConf

    def grpo(self, token_rewards, mask, index, norm):
        return self.core.compute_grpo_outcome_advantage(
            token_rewards, mask, index, norm_adv_by_std_in_grpo=norm
        )[0]

    def rloo(self, token_rewards, mask, index):
        return self.core.compute_rloo_outcome_advantage(token_rewards, mask, index)[0]

    def reinforce_pp(self, token_rewards, mask):
        cfg = self.conf.create({"gamma": 1.0})
        return self.core.compute_reinforce_plus_plus_outcome_advantage(token_rewards, mask, config=cfg)[0]

    def reinforce_pp_baseline(self, token_rewards, mask, index):
        return self.core.compute_reinforce_plus_plus_baseline_outcome_advantage(token_rewards, mask, index)[0]

    def agg_loss(self, loss, mask, mode, global_batch_size=None, loss_scale_factor=None):
        return self.core.agg_loss(
            loss, mask, mode, global_batch_size=global_batch_size, loss_scale_factor=loss_scale_factor
        )

    def vanilla(self, old, logp, adv, mask, mode, low, high, c):
        cfg = self.conf.create(
            {"clip_ratio": low, "clip_ratio_low": low, "clip_ratio_high": high, "clip_ratio_c": c,
             "global_batch_info": {}}
        )  # fmt: skip
        loss, metrics = self.core.compute_policy_loss_vanilla(old, logp, adv, mask, mode, cfg)
        return loss, {k.removeprefix("actor/"): v for k, v in metrics.items()}

    def gspo(self, old, logp, adv, mask, low, high):
        from verl.workers.config import ActorConfig

        cfg = ActorConfig(
            strategy="fsdp", clip_ratio=low, clip_ratio_low=low, clip_ratio_high=high,
            ppo_micro_batch_size_per_gpu=1, use_dynamic_bsz=False, rollout_n=1,
        )  # fmt: skip
        loss, metrics = self.core.compute_policy_loss_gspo(old, logp, adv, mask, "seq-mean-token-mean", cfg)
        return loss, {"ppo_kl": metrics["actor/ppo_kl"]}

    def value_loss(self, vpreds, returns, values, mask, clip):
        return self.core.compute_value_loss(vpreds, returns, values, mask, clip)

    def kl_penalty(self, logp, ref, kind):
        return self.core.kl_penalty(logp, ref, kind)

    def apply_kl_penalty(self, mask, token_scores, old, ref, beta, kind):
        from verl.protocol import DataProto
        from verl.trainer.ppo.ray_trainer import apply_kl_penalty

        tensors = {
            "response_mask": mask,
            "token_level_scores": token_scores,
            "old_log_probs": old,
            "ref_log_prob": ref,
        }
        data, metrics = apply_kl_penalty(
            DataProto.from_dict(tensors=tensors), self.core.FixedKLController(beta), kl_penalty=kind
        )
        return data.batch["token_level_rewards"], {k.removeprefix("actor/"): v for k, v in metrics.items()}

    def token_is_weights(self, log_ratio, mask, threshold):
        from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

        return compute_rollout_correction_weights(log_ratio, mask, "token", threshold)[0]


def own_or_why_not() -> tuple[Own | None, str]:
    """verl's own functions, or None and why they are not here."""
    try:
        import verl
    except ImportError as e:
        return None, f"verl does not import here ({e}); compared with the transcription only"
    if verl.__version__ != VERL_VERSION:
        return None, f"verl {verl.__version__} here; the comparisons are of verl {VERL_VERSION}"
    return Own(), ""
