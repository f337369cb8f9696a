"""Helpers the serve tests share: an app served by uvicorn in a thread of the test process."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_in_thread(app: Any) -> tuple[str, Callable[[], None]]:
    """Serve ``app`` on a free port of 127.0.0.1 (uvicorn, in a daemon thread), once it listens;
    returns its URL and the function that stops it."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=30)

    return f"http://127.0.0.1:{port}", stop
