"""`treeflash serve` in a subprocess on a free loopback port, for the tests that drive it over HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

import treeflash


class Server:
    """`treeflash serve ARGS` on a free loopback port, until stopped; its output goes to a log file in `log_dir`
    (by default beside the model, args[0])."""

    def __init__(self, *args: str, log_dir: Path | None = None):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        root = str(Path(treeflash.__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": "1"}
        self.log = open(Path(log_dir or Path(args[0]).parent) / f"server-{self.port}.log", "w+")
        self.process = subprocess.Popen([sys.executable, "-m", "treeflash.cli", "serve", *args, "--port", str(self.port),
                                         "--device", "cpu", "--log-level", "warning"],
                                        env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            assert self.process.poll() is None, f"the server exited:\n{self.output()}"
            assert time.monotonic() < deadline, f"the server did not come up:\n{self.output()}"
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)
