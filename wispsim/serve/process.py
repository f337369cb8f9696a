"""``wispsim serve`` as a child process: started in its own process group, waited on until it
answers its health check, emptied between validation points, and stopped with everything it
started (vLLM's engine processes outlive a parent that did not close them)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from wispsim.errors import WispsimError
from wispsim.serve.backend import ModelSource
from wispsim.serve.client import Client, health
from wispsim.serve.limits import ADMIN_TOKEN_ENV
from wispsim.serve.swarm import WispsimServer


class ServerProcess:
    """``wispsim serve`` in a child process (its own process group), stopped on exit."""

    def __init__(
        self, scenario_file: Path, policy: str, source: ModelSource, port: int, log_file: Path
    ) -> None:
        cmd = [
            sys.executable,
            "-m",
            "wispsim.cli",
            "serve",
            str(scenario_file),
            "--policy",
            policy,
            "--port",
            str(port),
        ]
        cmd += ["--model", source.model] if source.model else ["--arch", str(source.arch)]
        cmd += ["--dtype", source.dtype]
        self.url = f"http://127.0.0.1:{port}"
        self.log_file = log_file
        # the server's admin token, handed over in its environment (not on its command line)
        self.token = secrets.token_urlsafe(16)
        env = {**os.environ, ADMIN_TOKEN_ENV: self.token}
        log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_file, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )

    def target(self) -> WispsimServer:
        """This server as a swarm's target (its admin token, to read its log; not reset again)."""
        return WispsimServer(self.url, reset=False, token=self.token)

    def wait_ready(self, timeout: float = 600.0) -> dict[str, Any]:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                tail = [ln for ln in self.log_file.read_text(errors="replace").splitlines() if ln.strip()][
                    -1:
                ]
                raise WispsimError(
                    f"wispsim serve exited with {self.proc.returncode} before it was ready: "
                    f"{tail[0] if tail else '(no output)'} (log: {self.log_file})"
                )
            try:
                client = Client(self.url, 1)
                try:
                    facts, _ = health(client, samples=1)
                finally:
                    client.close()
                return facts
            except WispsimError:
                time.sleep(1.0)
        raise WispsimError(f"wispsim serve was not ready within {timeout:.0f} s (log: {self.log_file})")

    def reset(self, timeout: float = 120.0) -> None:
        """Empty the server between points (it refuses while rounds are still in flight)."""
        client = Client(self.url, 1)
        try:
            t0 = time.monotonic()
            while True:
                try:
                    auth = {"Authorization": f"Bearer {self.token}"}
                    client.call(client.request("POST", "/reset", headers=auth))
                    return
                except WispsimError:
                    if time.monotonic() - t0 > timeout:
                        raise
                    time.sleep(0.5)
        finally:
            client.close()

    def stop(self) -> None:
        """SIGTERM to the server's process group (uvicorn shuts down, the engine is closed), then
        SIGKILL to whatever of the group is left: vLLM's engine processes outlive a parent that
        did not close them."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._log.close()
