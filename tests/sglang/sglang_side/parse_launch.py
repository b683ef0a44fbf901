"""SGLang's own CLI parser on a launch command (run in .venv-sglang).

stdin: the command as a JSON list (`python -m sglang.launch_server ...`); stdout: the
ServerArgs fields it parses to, as JSON. Parsing goes through `ServerArgs.add_cli_args` and
`ServerArgs.from_cli_args`, as `sglang.launch_server` does before it resolves GPU defaults.
"""

import argparse
import json
import sys

from sglang.srt.server_args import ServerArgs


def main() -> None:
    cmd = json.loads(sys.stdin.read())
    assert cmd[1:3] == ["-m", "sglang.launch_server"], cmd[:3]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = ServerArgs.from_cli_args(parser.parse_args(cmd[3:]))
    fields = ("model_path", "host", "port", "random_seed", "tp_size", "mem_fraction_static")
    print(json.dumps({f: getattr(args, f) for f in fields}))


if __name__ == "__main__":
    main()
