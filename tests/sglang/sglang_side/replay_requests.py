"""Replay recorded HTTP requests into SGLang's own FastAPI app (run in .venv-sglang).

The app is `sglang.srt.entrypoints.http_server.app`, driven by Starlette's TestClient. In
place of its tokenizer manager (which would need a scheduler and a GPU) a recorder takes
each call, keeps the request object SGLang's route parsed from the body, and answers as
the real manager does on success. For /generate the recorder also runs the request
object's own `normalize_batch_and_arguments`, as the real manager does first.

stdin: [{"method", "path", "headers", "body"}]; stdout: [{"status", "body", "calls": [[method, fields]]}]
"""

import dataclasses
import json
import sys
from types import SimpleNamespace

from sglang.srt.entrypoints import http_server
from sglang.srt.managers.io_struct import LoRAUpdateOutput
from starlette.testclient import TestClient


def _fields(obj) -> dict:
    if obj is None:
        return {}
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if hasattr(obj, "__struct_fields__"):  # msgspec
        return {f: getattr(obj, f) for f in obj.__struct_fields__}
    if hasattr(obj, "model_dump"):  # pydantic
        return obj.model_dump()
    return dict(vars(obj))


class RecordingTokenizerManager:
    def __init__(self):
        self.calls: list[tuple[str, dict]] = []
        self.model_path = "/models/m"
        self.served_model_name = "m"
        self.is_generation = True
        self.model_config = SimpleNamespace(
            is_image_understandable_model=False,
            is_audio_understandable_model=False,
            hf_config=SimpleNamespace(model_type="llama", architectures=["LlamaForCausalLM"]),
        )

    def _record(self, name: str, obj) -> None:
        self.calls.append((name, _fields(obj)))

    def config_value(self, key: str):
        return {"weight_version": "7"}.get(key)

    async def _ok(self, name, obj, *answer):
        self._record(name, obj)
        return (True, "ok", *answer)

    async def init_weights_update_group(self, obj, request=None):
        return await self._ok("init_weights_update_group", obj)

    async def destroy_weights_update_group(self, obj, request=None):
        return await self._ok("destroy_weights_update_group", obj)

    async def begin_weight_update(self, obj, request=None):
        return await self._ok("begin_weight_update", obj)

    async def end_weight_update(self, obj, request=None):
        return await self._ok("end_weight_update", obj)

    async def update_weights_from_distributed(self, obj, request=None):
        return await self._ok("update_weights_from_distributed", obj)

    async def update_weights_from_disk(self, obj, request=None):
        return await self._ok("update_weights_from_disk", obj, 0)

    async def get_weights_by_name(self, obj, request=None):
        self._record("get_weights_by_name", obj)
        return [0.5] * obj.truncate_size

    async def flush_cache(self, timeout_s=0.0):
        self._record("flush_cache", SimpleNamespace(timeout_s=timeout_s))
        return SimpleNamespace(success=True, message="")

    async def pause_generation(self, obj):
        self._record("pause_generation", obj)

    async def continue_generation(self, obj):
        self._record("continue_generation", obj)

    async def release_memory_occupation(self, obj, request=None):
        self._record("release_memory_occupation", obj)

    async def resume_memory_occupation(self, obj, request=None):
        self._record("resume_memory_occupation", obj)

    async def load_lora_adapter(self, obj, request=None):
        self._record("load_lora_adapter", obj)
        return LoRAUpdateOutput(
            success=True, error_message="", loaded_adapters={obj.lora_name: obj.lora_path}
        )

    async def unload_lora_adapter(self, obj, request=None):
        self._record("unload_lora_adapter", obj)
        return LoRAUpdateOutput(success=True, error_message="", loaded_adapters={})

    def abort_request(self, rid="", abort_all=False):
        self._record("abort_request", SimpleNamespace(rid=rid, abort_all=abort_all))

    async def generate_request(self, obj, request=None):
        obj.normalize_batch_and_arguments()  # what the real manager does first
        self._record("generate_request", obj)
        yield [{"text": "", "output_ids": [], "meta_info": {}} for _ in range(obj.batch_size)]


def main() -> None:
    requests = json.loads(sys.stdin.read())
    manager = RecordingTokenizerManager()
    http_server.set_global_state(
        http_server._GlobalState(tokenizer_manager=manager, template_manager=None, scheduler_info={})
    )
    http_server.get_serving = lambda: SimpleNamespace(
        tokenizer_path="/models/m", preferred_sampling_params=None
    )
    results = []
    client = TestClient(http_server.app)  # no lifespan: it would start the real server's machinery
    for req in requests:
        before = len(manager.calls)
        content = None if req["body"] is None else req["body"].encode()
        resp = client.request(req["method"], req["path"], headers=req["headers"], content=content)
        try:
            body = resp.json()
        except ValueError:
            body = resp.text
        results.append({"status": resp.status_code, "body": body, "calls": manager.calls[before:]})
    print(json.dumps(results, default=repr))


if __name__ == "__main__":
    main()
