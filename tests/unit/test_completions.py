"""EngineClient.sample decodes a /generate answer into Completions that hold what the answer's
JSON holds, and names what is wrong with an answer it cannot read. SGLang's own answer is
held against it in tests/sglang/test_real_server.py."""

from __future__ import annotations

import asyncio

import httpx
import msgspec
import orjson
import pytest

from bench.sim_engine import SimSpec, serve
from infra.engines.client import EngineClient, EngineError
from infra.engines.completions import decode_completions
from tests.background_loop import background_loop

SPEC = SimSpec(median_tokens=8, slots=4, slot_tokens_per_s=2000)


@pytest.fixture(scope="module")
def url():
    with background_loop() as loop:
        yield asyncio.run_coroutine_threadsafe(serve(SPEC, 1), loop).result(timeout=30)[0]


def _reply(ids: list[int], logprobs: list, **meta) -> dict:
    triples = [[lp, t, f"<{t}>"] for lp, t in zip(logprobs, ids, strict=True)]
    return {
        "text": "".join(f"<{t}>" for t in ids),
        "output_ids": ids,
        "meta_info": {
            "id": "r-0",
            "finish_reason": {"type": "stop", "matched": ids[-1]},
            "weight_version": "3",
            "prompt_tokens": 2,
            "output_token_logprobs": triples,
            "input_token_logprobs": [[None, 5, None]],
            **meta,
        },
    }


def _client(body: bytes, status: int = 200) -> EngineClient:
    client = EngineClient("http://engine.test")
    client._http = httpx.Client(transport=httpx.MockTransport(lambda _: httpx.Response(status, content=body)))
    return client


def test_a_batch_answer_decodes_to_what_its_json_holds(url):
    client = EngineClient(url)
    params = [{"max_new_tokens": 4096, "sampling_seed": s, "stop_token_ids": [2]} for s in (11, 12)]
    params.append({"max_new_tokens": 3, "sampling_seed": 13})
    inputs, rids = [[5, 6], [5, 6], [7]], ["a", "b", "c"]
    want = client.generate(inputs, params, rid=rids)
    got = client.sample(inputs, params, rid=rids)
    for out, raw in zip(got, want, strict=True):
        meta = raw["meta_info"]
        assert out.output_ids == raw["output_ids"]
        assert out.logprobs == [t[0] for t in meta["output_token_logprobs"]]
        assert (out.finish, out.meta_info.id) == (meta["finish_reason"]["type"], meta["id"])
        assert out.meta_info.weight_version == meta["weight_version"]
    assert [out.finish for out in got] == ["stop", "stop", "length"]


def test_fields_it_does_not_read_and_a_single_answer_are_taken_as_they_come():
    one = _reply([7, 8, 2], [-0.5, -1, -0.25], cached_tokens=1, spec_verify_ct=0)
    [out] = decode_completions(orjson.dumps(one))
    assert out.output_ids == [7, 8, 2] and out.logprobs == [-0.5, -1.0, -0.25]
    assert (out.finish, out.meta_info.weight_version) == ("stop", "3")
    [unfinished] = decode_completions(orjson.dumps([_reply([4], [-1.0], finish_reason=None)]))
    assert unfinished.finish == ""


def test_an_answer_of_another_shape_is_an_engine_error_naming_the_field():
    bad = _reply([7, 8], [-0.5, None])  # a logprob the engine could not write
    with pytest.raises(EngineError, match=r"engine.test/generate: .*output_token_logprobs\[1\]"):
        _client(orjson.dumps([bad])).sample([[5]], {})
    with pytest.raises(msgspec.ValidationError, match="output_ids"):
        decode_completions(orjson.dumps([{"meta_info": {}}]))


def test_an_engines_refusal_keeps_its_own_message():
    with pytest.raises(EngineError, match="HTTP 400: n > 1") as refused:
        _client(orjson.dumps({"error": {"message": "n > 1"}}), 400).sample([[5]], {"n": 2})
    assert refused.value.status == 400
    with pytest.raises(EngineError, match="HTTP 200: paused for a sync"):
        _client(orjson.dumps({"success": False, "message": "paused for a sync"})).sample([[5]], {})
