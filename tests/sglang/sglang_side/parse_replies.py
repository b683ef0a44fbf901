"""Parse the built-in server's replies with SGLang's own types (run in .venv-sglang).

Weight endpoints: each reply body becomes the `io_struct` *ReqOutput type SGLang builds that
reply from, and goes through a msgpack round trip typed by it (SGLang's own IPC encoding),
which checks every field's type; an unknown field fails the constructor. /generate: each
`finish_reason` is rebuilt by SGLang's FINISH_* class and compared with its `to_json()`.

stdin: {"outputs": [[type_name, body]], "finish_reasons": [dict]}
stdout: {"outputs": [error or null], "finish_reasons": [sglang's json]}
"""

import json
import sys

import msgspec
from sglang.srt.managers import io_struct
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, FINISH_MATCHED_TOKEN


def _parse(type_name: str, body) -> str | None:
    cls = getattr(io_struct, type_name)
    try:
        fields = {"parameter": body} if type_name == "GetWeightsByNameReqOutput" else body
        decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(cls(**fields)), type=cls)
    except (TypeError, msgspec.ValidationError) as exc:
        return f"{type_name}: {exc}"
    return None if isinstance(decoded, cls) else f"{type_name}: decoded to {type(decoded)}"


def _finish(reason: dict) -> dict | None:
    if reason["type"] == "length":
        return FINISH_LENGTH(reason["length"]).to_json()
    if reason["type"] == "stop":
        return FINISH_MATCHED_TOKEN(reason["matched"]).to_json()
    return None


def main() -> None:
    job = json.loads(sys.stdin.read())
    print(
        json.dumps(
            {
                "outputs": [_parse(name, body) for name, body in job["outputs"]],
                "finish_reasons": [_finish(r) for r in job["finish_reasons"]],
            }
        )
    )


if __name__ == "__main__":
    main()
