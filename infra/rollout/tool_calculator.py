"""A two-turn tool-use rollout: the built-in example of `rollout.generate_fn`.

On `builtin:digit-add` prompts (`"3+4="`) the policy first writes one token; `?` calls
the calculator, which answers `[7]` (anything else gets `[]`). Then the policy writes its
final answer. The calculator's tokens are the environment's: loss_mask 0, so the trainer
learns when to call and what to do with the answer, never to predict the tool's output.

    rollout.generate_fn=infra.rollout.tool_calculator:two_turn_calculator
    data.reward=infra.rollout.tool_calculator:calculator_reward
"""

from __future__ import annotations

import re

from infra.rollout.custom import GroupRequest, Trajectory, turn

CALL = "?"
_EXPR = re.compile(r"(\d+)\s*([-+*])\s*(\d+)")
# Turn 2 seeds are offset so no turn-2 draw repeats a turn-1 draw of another sample.
_TURN2_SEED = 2**30


def calculate(prompt: str) -> str:
    found = _EXPR.search(prompt)
    if not found:
        return ""
    a, op, b = int(found.group(1)), found.group(2), int(found.group(3))
    return str({"+": a + b, "-": a - b, "*": a * b}[op])


def two_turn_calculator(req: GroupRequest) -> list[Trajectory]:
    tok, one = req.tokenizer, {**req.sampling_params, "max_new_tokens": 1}
    first = turn(req.engine, [req.prompt_ids] * req.n, one, req.seeds, [f"{r}-call" for r in req.rids])
    tool_ids = []
    for out in first:
        called = tok.decode(out["output_ids"], skip_special_tokens=True) == CALL
        tool_ids.append(tok.encode(f"[{calculate(req.prompt) if called else ''}]", add_special_tokens=False))
    second_inputs = [
        req.prompt_ids + out["output_ids"] + env for out, env in zip(first, tool_ids, strict=True)
    ]
    seeds = [s + _TURN2_SEED for s in req.seeds]
    second = turn(req.engine, second_inputs, one, seeds, [f"{r}-answer" for r in req.rids])
    trajectories = []
    for a, env, b in zip(first, tool_ids, second, strict=True):
        ids_a, ids_b = list(a["output_ids"]), list(b["output_ids"])
        lp_a = [t[0] for t in a["meta_info"]["output_token_logprobs"]]
        lp_b = [t[0] for t in b["meta_info"]["output_token_logprobs"]]
        trajectories.append(
            Trajectory(
                response_ids=ids_a + env + ids_b,
                loss_mask=[1] * len(ids_a) + [0] * len(env) + [1] * len(ids_b),
                engine_logprobs=lp_a + [0.0] * len(env) + lp_b,
                weight_version=min(
                    int(a["meta_info"]["weight_version"]), int(b["meta_info"]["weight_version"])
                ),
                finish_reason=(b["meta_info"].get("finish_reason") or {}).get("type", "stop"),
            )
        )
    return trajectories


def calculator_reward(prompt: str, response: str, label: str, **kw) -> float:
    """0.5 for calling the calculator, 0.5 for the right final answer (after the tool's `]`).

    The half for the call shapes the search: a random policy calls once in ~100 samples and
    would almost never also answer right, so without it GRPO would see no signal at all.
    """
    called = response.startswith(f"{CALL}[")
    answer = response.rsplit("]", 1)[-1].strip()
    return 0.5 * called + 0.5 * (answer == label.strip())
