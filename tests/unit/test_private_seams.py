"""Guards on the private parts of torch, Ray and transformers that the code builds on.

No public API does these jobs (each test says what it guards and why it is private). A
release that moves or changes one fails here, with a message naming the seam, the file
that uses it and the versions it was checked on, instead of as an obscure error deep in
a run (an unknown Ray system-config key, for one, crashes the GCS and surfaces as a
timeout waiting for a file). Pinned upper bounds in pyproject.toml keep a plain install on
checked versions; these tests are what to run before raising one.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version

import pytest
import torch


@contextmanager
def seam(name: str, used_in: str, package: str, checked_on: str) -> Iterator[None]:
    """Turn a broken expectation about `name` into a failure that says what to re-check."""
    try:
        yield
    except (ImportError, AttributeError, TypeError, KeyError, AssertionError) as e:
        pytest.fail(
            f"private seam {name} (used in {used_in}) no longer behaves as it did on {package} "
            f"{checked_on}; installed: {package} {version(package)}. {type(e).__name__}: {e}",
            pytrace=False,
        )


def test_dcp_fsspec_storage():
    # torch ships DCP's fsspec reader and writer only in a private module; dcp_io swaps the
    # writer's FileSystem for one whose mkdir does not create buckets
    with seam(
        "torch.distributed.checkpoint._fsspec_filesystem", "infra/storage/dcp_io.py", "torch", "2.13.0"
    ):
        import fsspec
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint._fsspec_filesystem import FileSystem, FsspecReader, FsspecWriter

        from infra.storage import dcp_io

        made: list[str] = []

        class Spy(dcp_io._NoBucketFileSystem):
            def mkdir(self, path) -> None:
                made.append(str(path))
                super().mkdir(path)

        writer = FsspecWriter("memory://seam/ckpt")
        assert isinstance(writer.fs, FileSystem)
        assert isinstance(writer.fs.fs, fsspec.AbstractFileSystem)
        spy = Spy()
        spy.fs = writer.fs.fs
        writer.fs = spy
        dcp.save({"w": torch.ones(2)}, storage_writer=writer)
        assert made, "DCP's writer no longer makes its folder through its FileSystem's mkdir"
        loaded = {"w": torch.zeros(2)}
        dcp.load(loaded, storage_reader=FsspecReader("memory://seam/ckpt"))
        assert torch.equal(loaded["w"], torch.ones(2))


def test_c10d_group_helper_and_rank_map():
    # SGLang's engines build the weight-update group with these; the trainer side must
    # build it the same way to meet them (the sglang conformance tests hold the key layout)
    with seam(
        "torch.distributed.distributed_c10d._new_process_group_helper / _world.pg_group_ranks",
        "infra/weights/group.py",
        "torch",
        "2.13.0",
    ):
        from torch.distributed import distributed_c10d as c10d

        params = list(inspect.signature(c10d._new_process_group_helper).parameters)
        assert params[:5] == ["group_size", "group_rank", "global_ranks_in_group", "backend", "store"], params
        assert {"group_name", "backend_options", "timeout"} <= set(params), params
        assert isinstance(c10d._world.pg_group_ranks, dict)


def test_ray_system_config_keys():
    # ray.init(_system_config=...) is Ray's only way to set these; the GCS dies on a key it
    # does not know. A local cluster started by the run's own call must hold all three.
    import ray

    from infra.cluster.placement import plan_placement
    from infra.cluster.ray_cluster import TASK_EVENTS_KEPT, connect
    from infra.config import ClusterConfig

    layout = plan_placement(ClusterConfig())
    expected = {
        "num_workers_soft_limit": layout.num_processes + 4,
        "prestart_worker_first_driver": False,
        "task_events_max_num_task_in_gcs": TASK_EVENTS_KEPT,
    }
    with seam("ray.init(_system_config=...)", "infra/cluster/ray_cluster.py", "ray", "2.60.0"):
        assert connect("", layout, None, {}) is True  # started here: stopped here
    try:
        with seam("ray.init(_system_config=...)", "infra/cluster/ray_cluster.py", "ray", "2.60.0"):
            from ray._private.state import state
            from ray._raylet import Config

            held = state.get_system_config()  # what the GCS started with
            assert {k: held.get(k) for k in expected} == expected, held
            # what this driver's own config says, as it received it from the GCS
            assert Config.task_events_max_num_task_in_gcs() == TASK_EVENTS_KEPT < 100_000
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory):
    from infra.config import TinyModelConfig
    from infra.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelConfig())


def test_no_split_modules_name_the_decoder_layers(tiny_dir):
    # transformers' own attribute for "the block not to split" (accelerate reads it); no
    # public method gives the repeated block of an arbitrary architecture
    from transformers import AutoModelForCausalLM

    from infra.trainer.critic_rank import load_value_model
    from infra.trainer.parallelize import _decoder_layers

    with seam("PreTrainedModel._no_split_modules", "infra/trainer/parallelize.py", "transformers", "5.25.0"):
        policy = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
        for model in (policy, load_value_model(str(tiny_dir))):
            names = model._no_split_modules
            assert isinstance(names, list | tuple | set) and names, names
            layers = _decoder_layers(model)
            assert len(layers) == model.config.num_hidden_layers, (names, len(layers))


def test_fast_tokenizer_decode_is_the_rust_decode(tiny_dir):
    # decode_many hands a batch to the Rust tokenizer where the tokenizer's decode is
    # transformers' generic fast one (its `_decode`, private, is the Rust call plus an
    # optional clean-up of spaces): no public API says what `decode` adds
    import random

    from infra.model.tokenizer import _decodes_in_rust, decode_many, load_tokenizer

    with seam("PreTrainedTokenizerFast._decode", "infra/model/tokenizer.py", "transformers", "5.25.0"):
        tok = load_tokenizer(str(tiny_dir))
        assert _decodes_in_rust(tok)
        rng = random.Random(0)
        ids = [[rng.randrange(len(tok)) for _ in range(rng.randrange(0, 20))] for _ in range(200)]
        ids += [[tok.bos_token_id, 40, tok.eos_token_id], [tok.pad_token_id], []]
        for skip in (True, False):
            assert decode_many(tok, ids, skip) == [tok.decode(x, skip_special_tokens=skip) for x in ids]
        tok.clean_up_tokenization_spaces = True  # a clean-up is transformers' doing: decoded one by one
        assert not _decodes_in_rust(tok)
        assert decode_many(tok, ids) == [tok.decode(x, skip_special_tokens=True) for x in ids]


def test_llama_internals_the_lean_decoder_reads(tiny_dir):
    # the lean step reads LlamaForCausalLM's modules directly; `supports` reads some with
    # defaults, so a renamed attribute would pass it silently: each must exist as named
    from transformers import AutoModelForCausalLM, LlamaConfig

    from infra.engine_server import lean_llama

    with seam("transformers Llama internals", "infra/engine_server/lean_llama.py", "transformers", "5.25.0"):
        model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
        assert type(model).__name__ == "LlamaForCausalLM"
        core = model.model
        for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
            assert hasattr(core, name), f"LlamaModel.{name}"
        assert hasattr(model, "lm_head")
        for name in ("inv_freq", "rope_type", "attention_scaling"):
            assert hasattr(core.rotary_emb, name), f"LlamaRotaryEmbedding.{name}"
        assert hasattr(core.norm, "variance_epsilon")
        layer = core.layers[0]
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling"):
            assert hasattr(layer.self_attn, name), f"LlamaAttention.{name}"
        for name in ("gate_proj", "up_proj", "down_proj"):
            assert hasattr(layer.mlp, name), f"LlamaMLP.{name}"
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            assert hasattr(norm, "variance_epsilon"), "LlamaRMSNorm.variance_epsilon"
        config = LlamaConfig()
        for name in ("attention_bias", "mlp_bias", "hidden_act", "pretraining_tp"):
            assert hasattr(config, name), f"LlamaConfig.{name}"
        assert lean_llama.supports(model)


def test_peft_lora_layer_attributes_and_names(tiny_dir):
    # The merge of a sharded adapter into its weight (infra/trainer/lora_merge.py) reads each
    # adapted layer's factors and scale: peft's LoraLayer attributes, which its docs do not
    # list as API (merge_and_unload does the merge only on whole, unsharded weights). The
    # base model's names come from stripping peft's wrapper names.
    from transformers import AutoModelForCausalLM

    from infra.config import LoraConfig
    from infra.model.lora import apply_lora, base_name, lora_layers

    with seam("peft LoraLayer.base_layer/lora_A/lora_B/scaling", "infra/model/lora.py", "peft", "0.21.2"):
        base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
        plain_names = set(base.state_dict())
        model = apply_lora(base, LoraConfig(r=4, alpha=12, target_modules=["q_proj", "up_proj"]))
        layers = lora_layers(model)
        assert len(layers) == 2 * base.config.num_hidden_layers, len(layers)
        for layer in layers:
            assert layer.name in plain_names, layer.name
            assert layer.scale == 3.0 and layer.a.shape[0] == 4 and layer.b.shape[1] == 4
            assert layer.weight.shape == (layer.b.shape[0], layer.a.shape[1])
        wrapped = {base_name(n) for n in model.state_dict() if ".lora_" not in n}
        assert wrapped == plain_names, wrapped ^ plain_names
