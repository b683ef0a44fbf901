"""A local S3 endpoint for the tests and the benchmarks: moto's server in a child process.

The child binds port 0 and reports the port it got, so nothing can take the port between
a probe and the bind. A server that cannot start (moto not installed, the child exiting,
no answer in time) raises `RuntimeError` with the child's own error output.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from infra.retry import poll

# The child: moto's threaded server on port 0, its port on stdout, then serve until killed.
# The server runs in a thread, and `start()` would wait forever for one that failed to bind:
# a failure in any thread ends the child instead. Werkzeug logs every request to stderr at
# INFO; only warnings are kept.
_CHILD = """
import logging, os, sys, threading, traceback
from moto.server import ThreadedMotoServer

def end(args):
    traceback.print_exception(args.exc_type, args.exc_value, args.exc_traceback)
    os._exit(1)

threading.excepthook = end
logging.getLogger("werkzeug").setLevel(logging.WARNING)
server = ThreadedMotoServer(sys.argv[1], 0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
threading.Event().wait()
"""
# A developer's own AWS settings that would send requests to a real account instead.
AWS_SETTINGS_TO_CLEAR = ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION")


def aws_env(endpoint: str, key: str = "testing") -> dict[str, str]:
    """The AWS_* variables that point boto3, s3fs and their child processes at `endpoint`
    (moto takes any credentials)."""
    return {
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": key,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }


def _read_port(proc: subprocess.Popen, timeout_s: float) -> int | None:
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline and proc.poll() is None:
            if sel.select(timeout=0.1):
                line = proc.stdout.readline().strip()
                return int(line) if line.isdigit() else None
    return None


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def moto_server(host: str = "127.0.0.1", timeout_s: float = 30.0) -> Iterator[str]:
    """A moto S3 server for the time of the block; yields its endpoint, `http://host:port`,
    once it answers HTTP."""
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, host],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

        def failed(why: str) -> RuntimeError:
            errors.seek(0)
            tail = errors.read()[-2000:].decode(errors="replace").strip()
            return RuntimeError(f"moto S3 server: {why}" + (f"; its output:\n{tail}" if tail else ""))

        try:
            port = _read_port(proc, timeout_s)
            if port is None:
                # its stdout can close a moment before its exit status is there to read
                try:
                    code = proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    code = None
                raise failed(
                    f"exited with code {code}" if code is not None else f"no port in {timeout_s:g} s"
                )
            endpoint = f"http://{host}:{port}"

            def answers() -> bool:
                if proc.poll() is not None:
                    raise failed(f"exited with code {proc.returncode}")
                urllib.request.urlopen(endpoint, timeout=1).close()
                return True

            if not poll(answers, timeout_s):
                raise failed(f"no answer at {endpoint} in {timeout_s:g} s")
            yield endpoint
        finally:
            _stop(proc)
