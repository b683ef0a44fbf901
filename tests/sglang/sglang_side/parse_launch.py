"""SGLang's own CLI parser on a launch command (run in .venv-sglang).

stdin: the command as a JSON list (`python -m sglang.launch_server ...`); stdout: the
ServerArgs fields it parses to, as JSON. Parsing goes through `ServerArgs.add_cli_args` and
`ServerArgs.from_cli_args`, as `sglang.launch_server` does before it resolves GPU defaults;
a `--config` file is merged in by SGLang's own ConfigArgumentMerger first, as it does.
"""

import argparse
import json
import sys

from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

FIELDS = (
    "model_path",
    "host",
    "port",
    "random_seed",
    "tp_size",
    "mem_fraction_static",
    "device",
    "attention_backend",
    "disable_cuda_graph",
    "disable_overlap_schedule",
    "skip_server_warmup",
    "sleep_on_idle",
    "weight_version",
    "enable_memory_saver",
    "enable_weights_cpu_backup",
    "api_key",
    "dtype",
    "enable_lora",
    "max_lora_rank",
    "lora_target_modules",
    "max_loras_per_batch",
    "lora_backend",
)


def main() -> None:
    cmd = json.loads(sys.stdin.read())
    assert cmd[1:3] == ["-m", "sglang.launch_server"], cmd[:3]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    argv = cmd[3:]
    if "--config" in argv:
        argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
    args = ServerArgs.from_cli_args(parser.parse_args(argv))
    print(json.dumps({f: getattr(args, f) for f in FIELDS}, default=sorted))  # sets as lists


if __name__ == "__main__":
    main()
