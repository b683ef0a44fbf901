"""After a sync: does every engine hold what the trainer sent?

`/get_weights_by_name` answers a tensor's first `truncate_size` rows (a 1-D tensor: its
first values) cast to float32, so the trainer's tensor is cast to the engine's dtype, then
to float32, and its same leading rows are compared. With tp > 1 an engine answers from tp
rank 0, whose shard of a row-split tensor holds the leading rows; rows are compared as a
prefix of the trainer's, so a tp shard compares too. Few SGLang model classes implement
the endpoint (Llama does); the check is a switch for that reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from infra.engines.client import EngineError
from infra.weights.engines import EngineLink

CHECK_ROWS = 100  # SGLang's default truncate_size


class WeightMismatchError(RuntimeError):
    """An engine holds a tensor that differs from the trainer's after a weight sync."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


@dataclass
class WeightCheck:
    links: list[EngineLink]
    rows: int = CHECK_ROWS
    tensors: int = 0
    values: int = 0
    max_abs_diff: float = 0.0
    mismatches: list[str] = field(default_factory=list)

    def compare(self, name: str, full: torch.Tensor) -> None:
        """Compare one trainer tensor with every engine's answer."""
        self.tensors += 1
        for link in self.links:
            expected = full.detach().cpu().to(link.dtype).to(torch.float32)[: self.rows]
            try:
                answer = link.client.get_weights_by_name(name, self.rows)
            except EngineError as exc:  # SGLang answers 400 for model classes without the endpoint
                self.mismatches.append(f"{name}: engine {link.url} cannot report it ({exc})")
                continue
            got = torch.tensor(answer, dtype=torch.float32)
            if got.dim() != expected.dim() or got.shape[1:] != expected.shape[1:] or len(got) > len(expected):
                self.mismatches.append(
                    f"{name}: engine {link.url} answers shape {list(got.shape)}, "
                    f"trainer rows have {list(expected.shape)}"
                )
                continue
            diff = (got - expected[: len(got)]).abs().max().item() if got.numel() else 0.0
            self.values += got.numel()
            self.max_abs_diff = max(self.max_abs_diff, diff)
            if diff > 0:
                self.mismatches.append(
                    f"{name}: engine {link.url} differs from the trainer (max abs diff {diff:.3g})"
                )

    def report(self) -> dict:
        return {
            "weights_checked": self.tensors,
            "values_checked": self.values,
            "max_abs_diff": self.max_abs_diff,
        }

    def raise_on_mismatch(self) -> dict:
        report = self.report()
        if self.mismatches:
            more = f" (and {len(self.mismatches) - 1} more)" if len(self.mismatches) > 1 else ""
            raise WeightMismatchError(
                f"{self.mismatches[0]}{more}; max abs diff over all engines {self.max_abs_diff:.3g}",
                {**report, "mismatches": self.mismatches},
            )
        return report
