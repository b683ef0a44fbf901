"""A reward-model service over HTTP: `data.reward: http://host:port/path`.

Each request POSTs a JSON list of `{"prompt", "response", "label"}` (at most
`data.remote_reward.batch_size` items) and expects a JSON list of numbers back, one per
item, in order (or `{"rewards": [...]}`). Requests run `concurrency` at a time; a request
that fails (connection error, 5xx, timeout, malformed answer) is retried with backoff (the
shared policy, `infra.retry`), and when its tries are spent, or at once for a refusal
(4xx), its samples are marked failed, as a reward function that raises.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
from tenacity import RetryError

from infra.config import RemoteRewardConfig
from infra.retry import backoff, is_transient


class RemoteRewardError(RuntimeError):
    pass


class RemoteReward:
    reward_scope = "batch"

    def __init__(self, url: str, options: RemoteRewardConfig, timeout_s: float | None) -> None:
        self.url = url
        self.options = options
        self.timeout_s = timeout_s or 60.0

    def __call__(self, prompts: list[str], responses: list[str], labels: list[str], **kw) -> list[object]:
        items = [
            {"prompt": p, "response": r, "label": lab}
            for p, r, lab in zip(prompts, responses, labels, strict=True)
        ]
        size = self.options.batch_size
        batches = [items[i : i + size] for i in range(0, len(items), size)]
        with ThreadPoolExecutor(self.options.concurrency, "remote-reward") as pool:
            answers = list(pool.map(self._post_with_retries, batches))
        return [value for answer in answers for value in answer]

    def _post_with_retries(self, batch: list[dict]) -> list[object]:
        retrying = backoff(
            f"reward request to {self.url}",
            first_delay_s=self.options.backoff_s,
            attempts=self.options.retries + 1,
            # a garbled answer may come from a server mid-restart: worth another try too
            retry_on=lambda e: is_transient(e) or isinstance(e, RemoteRewardError),
        )
        try:
            return retrying(self._post, batch)
        except RetryError as spent:
            error = spent.last_attempt.exception()
        except (httpx.HTTPError, RemoteRewardError) as refused:
            error = refused
        failure = RemoteRewardError(f"{self.url}: {type(error).__name__}: {error}")
        return [failure] * len(batch)

    def _post(self, batch: list[dict]) -> list[object]:
        resp = httpx.post(self.url, json=batch, timeout=self.timeout_s)
        resp.raise_for_status()
        try:
            data = resp.json()
        except ValueError as e:
            raise RemoteRewardError(f"the answer is not JSON: {resp.text[:200]!r}") from e
        rewards = data.get("rewards") if isinstance(data, dict) else data
        if not isinstance(rewards, list) or len(rewards) != len(batch):
            raise RemoteRewardError(f"expected a list of {len(batch)} rewards, got {str(data)[:200]}")
        return rewards
