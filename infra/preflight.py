"""Everything about a run that can be checked before any actor starts, checked then.

`preflight(cfg)` runs in the flow before `RLSystem` starts anything: the reward plug-in
imports (where the Ray workers will import it too), the data files exist, hold the
configured columns and at least one batch of prompts, the model directory loads, every
character of every prompt has a token, every prompt plus max_new_tokens fits the model's
positions, storage answers and is writable, and the run folder may be used as
`checkpoint.resume` asks. Each failure is a `PreflightError` naming the field or file.
Only when every check passed does `resume=fresh` delete the old outputs.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field

from infra.config import RunConfig
from infra.data.prompts import load_rows, with_split
from infra.data.rewards import REWARDS, resolve_reward
from infra.data.splits import train_and_eval_rows
from infra.data.templating import PromptFormatter
from infra.model import tokenizer as tokenizers
from infra.storage.fs import RunStore, storage_options
from infra.storage.run_folder import clear_for_fresh_start, finished_message, refuse_if_used, resume_point

log = logging.getLogger(__name__)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class PreflightError(ValueError):
    """A run that cannot work, found before anything started; the message names the field."""


@dataclass
class Preflight:
    finished: str | None = None  # why there is nothing to do, for a resumed finished run
    cleared: list[str] = field(default_factory=list)  # what resume=fresh deleted
    warnings: list[str] = field(default_factory=list)  # legal but likely slow or wrong
    num_train_prompts: int = 0  # train rows (less a held-out eval split): the schedule knows epoch ends


def preflight(cfg: RunConfig) -> Preflight:
    store = RunStore(cfg.storage, cfg.run_name)
    _check("data.reward", lambda: check_reward(cfg.data.reward))
    if cfg.rollout.generate_fn:
        from infra.rollout.custom import resolve_generate_fn

        _check("rollout.generate_fn", lambda: resolve_generate_fn(cfg.rollout.generate_fn))
    train_file = _check("data.train_path", lambda: _rows(cfg, cfg.data.train_path, "train"))
    train, evals = _check(
        "data.eval_path", lambda: train_and_eval_rows(cfg, train_file, storage_options(cfg.storage))
    )
    # the file's rows, numbered as in the file; held-out eval rows are among them
    rows = {"data.train_path": train_file}
    if evals and not cfg.holds_out_eval:
        rows["data.eval_path"] = evals
    for d in cfg.eval.datasets:
        where = f"eval.datasets[{d.name}]"
        rows[f"{where}.path"] = _check(f"{where}.path", lambda d=d: _rows(cfg, d.path, "eval"))
        if d.reward:
            _check(f"{where}.reward", lambda d=d: check_reward(d.reward))
    check_batch_fits(cfg, len(train), len(train_file) - len(train))
    if cfg.rollout.engine == "sglang" and not cfg.cluster.ray_address:
        check_sglang_python(cfg.rollout.sglang_python)
    tokenizer, positions = _check("model.path", lambda: load_tokenizer(cfg, store))
    if tokenizer is not None:
        check_stop_tokens(cfg, tokenizer)
        check_characters(cfg, tokenizer, rows)
        check_lengths(cfg, tokenizer, positions, rows)
    _check("storage.uri", lambda: check_writable(store))
    _check("checkpoint.resume", lambda: refuse_if_used(cfg, store))
    point = _check("checkpoint.resume", lambda: resume_point(cfg, store))
    result = Preflight(
        finished=finished_message(cfg, point),
        warnings=oversubscription(cfg),
        num_train_prompts=len(train),
    )
    if cfg.checkpoint.resume == "fresh":
        result.cleared = clear_for_fresh_start(store)
        if result.cleared:
            log.info("checkpoint.resume=fresh: deleted %s from %s", ", ".join(result.cleared), store.run_uri)
    return result


def already_finished(cfg: RunConfig) -> str | None:
    """Why a run has nothing to do, checked before the command starts anything (Ray, the
    Prefect API): its checkpoint already holds all num_rollout iterations.

    Only the checkpoint's meta is read. A folder or checkpoint that cannot be read is no
    answer here: the flow's `preflight` then reports it, after the checks that come before
    it, naming the field."""
    if cfg.checkpoint.resume in ("never", "fresh"):
        return None
    try:
        return finished_message(cfg, resume_point(cfg, RunStore(cfg.storage, cfg.run_name)))
    except Exception:  # noqa: BLE001 - see the docstring: preflight reports it in order
        return None


def _check(name: str, fn):
    try:
        return fn()
    except PreflightError:
        raise
    except Exception as e:  # noqa: BLE001 - every failure becomes one message naming the field
        message = str(e)
        prefix = "" if message.startswith(name) else f"{name}: "
        raise PreflightError(f"{prefix}{message or type(e).__name__}") from e


def _rows(cfg: RunConfig, path: str, split: str) -> list[dict]:
    d = cfg.data
    return load_rows(with_split(path, split), d.prompt_key, d.label_key, storage_options(cfg.storage))


def _check_reachable(url: str) -> None:
    """A reward service must at least accept connections (its API is only POST)."""
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=5).close()
    except OSError as e:
        raise PreflightError(f"data.reward: the reward service {url} does not accept connections: {e}") from e


def check_reward(spec: str) -> None:
    """The reward imports here, and from where the Ray workers will look for it."""
    if spec in REWARDS:
        return
    if spec.startswith(("http://", "https://")):
        _check_reachable(spec)
        return
    resolve_reward(spec)
    module_name = spec.rpartition(":")[0]
    if module_name.endswith(".py"):
        return  # loaded by path everywhere
    module = sys.modules[module_name]
    origin = os.path.realpath(getattr(module, "__file__", None) or "")
    if not origin or not os.path.exists(origin):
        return  # built-in or namespace module: the workers have the same
    # The workers' import path: this repository, PYTHONPATH, the installed packages. The
    # driver also sees its current directory (python -m), which the workers do not.
    cwd = os.path.realpath(os.getcwd())
    visible = [REPO_ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    visible += [p for p in sys.path if p and os.path.realpath(p) != cwd]
    if not any(origin.startswith(os.path.realpath(p) + os.sep) for p in visible if os.path.isdir(p)):
        raise PreflightError(
            f"data.reward: module {module_name!r} ({origin}) imports here only because it lies in the "
            "current directory; the Ray workers would not find it. Add its folder to PYTHONPATH, "
            f"install it, or name the file: data.reward={os.path.relpath(origin)}:{spec.rpartition(':')[2]}"
        )


def load_tokenizer(cfg: RunConfig, store: RunStore):
    """The model's tokenizer and positions; (None, None) when the model lives only on the
    cluster's nodes (a local path that this machine lacks, with a remote Ray cluster)."""
    from infra.model.loading import BUILTIN_TINY, localize

    path = cfg.model.path
    if path == BUILTIN_TINY:
        from infra.model.tiny import build_char_tokenizer

        return build_char_tokenizer(), cfg.model.tiny.max_position_embeddings
    if path.startswith("builtin:"):
        raise PreflightError(f"model.path: unknown built-in model {path!r} (known: {BUILTIN_TINY})")
    if "://" not in path and not os.path.exists(path) and cfg.cluster.ray_address:
        log.warning("model.path %s is not on this machine; it is checked on the cluster", path)
        return None, None
    from transformers import AutoConfig

    local = localize(path, store.options)
    try:
        config = AutoConfig.from_pretrained(local, local_files_only=True)
        tokenizer = tokenizers.load_tokenizer(local, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds
        raise PreflightError(f"model.path: {path} does not load as an HF model: {e}") from e
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return tokenizer, positions


def check_sglang_python(configured: str) -> None:
    """The interpreter that will run `sglang.launch_server` exists and finds SGLang (on a
    local cluster the engines start on this machine; on a remote one, on its nodes)."""
    from infra.engines.launch import sglang_interpreter

    python = sglang_interpreter(configured)
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)"
    try:
        found = subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except OSError as e:
        raise PreflightError(f"rollout.sglang_python: cannot run {python}: {e}") from e
    if not found:
        raise PreflightError(
            f"rollout.sglang_python: {python} cannot import sglang; build the SGLang environment with "
            "`make sglang-venv` or set rollout.sglang_python to an interpreter that has SGLang"
        )


def check_batch_fits(cfg: RunConfig, num_prompts: int, held_out: int = 0) -> None:
    """One batch draws distinct prompts: a batch larger than the data would hold the same
    prompt twice (and every epoch end would fall inside a batch). `held_out`: rows of the
    train file held out for evaluation, not among `num_prompts`."""
    r = cfg.rollout
    batch = r.prompts_drawn
    if batch > num_prompts:
        where = cfg.data.train_path
        if held_out:
            where += f"; {held_out} more held out for evaluation since data.eval_path is empty"
        field = f"rollout.prompts_per_rollout={r.prompts_per_rollout}"
        if r.over_sample_prompts:
            field += f" + rollout.over_sample_prompts={r.over_sample_prompts}"
        raise PreflightError(
            f"{field} exceeds the {num_prompts} prompts of data.train_path "
            f"({where}): a batch would hold a prompt twice; lower it or add prompts"
        )


def check_characters(cfg: RunConfig, tokenizer, rows: dict[str, list[dict]]) -> None:
    """Every character of every prompt has a token: a tokenizer with an unknown token (the
    built-in character one knows printable ASCII only) would silently train on `<unk>`."""
    if getattr(tokenizer, "unk_token_id", None) is None:
        return
    unk = tokenizer.unk_token_id
    system = cfg.data.system_prompt or ""
    if missing := tokenizers.unknown_characters(tokenizer, system):
        raise PreflightError(
            f"data.system_prompt: the model's tokenizer has no token for "
            f"{tokenizers.describe_characters(missing)}"
        )
    for name, table in rows.items():
        texts = [r["prompt"] if isinstance(r["prompt"], str) else "".join(m["content"] for m in r["prompt"])
                 for r in table]  # fmt: skip
        if not texts:
            continue
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]  # one batched call
        for i, (text, ids) in enumerate(zip(texts, encoded, strict=True)):
            if unk not in ids:
                continue
            chars = tokenizers.unknown_characters(tokenizer, text)
            raise PreflightError(
                f"{name}: row {i}: the model's tokenizer has no token for "
                f"{tokenizers.describe_characters(chars)} (the built-in tiny model's tokenizer knows "
                "printable ASCII and newline only)"
            )


def check_stop_tokens(cfg: RunConfig, tokenizer) -> None:
    for s in cfg.rollout.sampling.stop:
        n = len(tokenizer.encode(s, add_special_tokens=False))
        if n != 1:
            raise PreflightError(
                f"rollout.sampling.stop: {s!r} is {n} tokens; stop strings must be one token"
            )


def check_lengths(cfg: RunConfig, tokenizer, positions: int | None, rows: dict[str, list[dict]]) -> None:
    """Longest prompt plus max_new_tokens must fit the model's positions."""
    if not positions:
        return
    new = cfg.rollout.sampling.max_new_tokens
    if new >= positions:
        raise PreflightError(
            f"rollout.sampling.max_new_tokens={new} leaves no room for a prompt: the model has "
            f"{positions} positions"
        )
    d = cfg.data
    if d.max_prompt_len is not None and d.max_prompt_len + new > positions:
        raise PreflightError(
            f"data.max_prompt_len={d.max_prompt_len} + rollout.sampling.max_new_tokens={new} exceeds the "
            f"model's {positions} positions"
        )
    fmt = PromptFormatter(
        tokenizer, d.apply_chat_template, d.system_prompt, d.max_prompt_len, d.overlong_prompt
    )
    for name, table in rows.items():
        try:
            # as the engines will see them: templated, and dropped or cut at max_prompt_len
            lengths = [len(ids) if (ids := fmt.ids(r["prompt"])) is not None else 0 for r in table]
        except ValueError as e:
            raise PreflightError(f"{name}: {e}") from e
        longest = max(range(len(lengths)), key=lengths.__getitem__)
        if lengths[longest] + new > positions:
            raise PreflightError(
                f"{name}: row {longest} has a prompt of {lengths[longest]} tokens; with "
                f"rollout.sampling.max_new_tokens={new} it exceeds the model's {positions} positions"
            )


def oversubscription(cfg: RunConfig) -> list[str]:
    """A local cluster whose processes will thrash for want of cores runs, but slowly (contended
    steps measured 10-20x slower); say so rather than stay silent.

    Single-threaded processes may share cores: the demo's two trainer ranks and one engine
    use 89% of 2 cores (bench.cpu_budget), the engine generating while the ranks train.
    What thrashes: ranks that train together (actor and critic: a collective waits for its
    slowest rank) without a core for each thread, engines that alone want more cores than
    there are, and multi-threaded (OpenMP) processes sharing cores, as engines and trainer
    do in async mode."""
    if cfg.cluster.ray_address:
        return []
    c, have = cfg.cluster, os.cpu_count() or 1
    threads = f"x threads_per_worker={c.threads_per_worker}"
    critics = c.critic.num_workers if cfg.critic.enabled else 0
    training = (c.trainer.num_workers + critics) * c.threads_per_worker
    engines = c.engines.num_workers * c.threads_per_worker
    critic_ranks = f" and {critics} critic ranks" if critics else ""
    out = []
    if training > have:
        out.append(
            f"cluster: {c.trainer.num_workers} trainer ranks{critic_ranks} {threads} train together and want "
            f"{training} cores; this machine has {have}, so every collective waits for a descheduled rank"
        )
    if engines > have:
        out.append(
            f"cluster: {c.engines.num_workers} engines {threads} want {engines} cores; this machine has {have}"
        )
    if not out and c.threads_per_worker > 1 and cfg.mode == "async" and training + engines > have:
        out.append(
            f"cluster: trainer ranks and engines {threads} generate and train at once and want "
            f"{training + engines} cores; this machine has {have}, and multi-threaded processes that share "
            "cores thrash (threads_per_worker=1 shares them well)"
        )
    return out


def check_writable(store: RunStore) -> None:
    """Storage answers and accepts writes, without creating anything that stays."""
    if store.is_local:
        path = store.path()
        while not os.path.exists(path):
            path = os.path.dirname(path)
        if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
            raise PreflightError(f"storage.uri: cannot write under {store.run_uri} ({path} is not writable)")
        return
    probe = f".preflight-{uuid.uuid4().hex}"
    try:
        store.write_bytes(probe, b"")
        store.delete(probe)
    except Exception as e:  # noqa: BLE001
        raise PreflightError(f"storage.uri: cannot write to {store.run_uri}: {type(e).__name__}: {e}") from e
