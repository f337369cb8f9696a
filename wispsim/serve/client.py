"""The swarm's HTTP side: an httpx client on its own thread and asyncio loop, for the SimPy
thread (the devices, :mod:`wispsim.serve.swarm`) to call, and the clock offset of a server that
reports its clock (``GET /health``). Any HTTP failure is a :class:`SwarmError`, one line naming
the URL.

A 429 or 503 is the server saying "not now": the request is sent again after its
``Retry-After`` (else a doubling backoff from 0.1 s, capped at 2 s), for at most ``retry_s``
seconds in all; ``retries`` counts them."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import TYPE_CHECKING, Any

from wispsim.errors import WispsimError

if TYPE_CHECKING:
    from wispsim.config import Scenario


class SwarmError(WispsimError):
    pass


RETRY_STATUS = (429, 503)  # the server's "not now": sent again after a pause
RETRY_S = 60.0  # the longest a request keeps trying


def retry_after(header: str | None, backoff: float) -> float:
    """Seconds to wait before trying again: the ``Retry-After`` header's (delta seconds), else
    ``backoff``."""
    try:
        value = float(header) if header is not None else backoff
    except ValueError:
        value = backoff
    return min(max(value, 0.0), 60.0) if value == value else backoff


class Client:
    """An HTTP client on its own thread and asyncio loop (httpx), for the SimPy thread to call."""

    def __init__(
        self, url: str, connections: int, read_timeout: float = 600.0, retry_s: float = RETRY_S
    ) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.retry_s = retry_s
        self.retries = 0
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="wispsim-swarm-http", daemon=True)
        self._thread.start()
        # idle connections are dropped here well before the server drops them (wispsim serve keeps
        # them 75 s), so a request is never sent on a connection the server is closing
        limits = httpx.Limits(
            max_connections=connections + 4, max_keepalive_connections=connections + 4, keepalive_expiry=5.0
        )
        timeout = httpx.Timeout(read_timeout, connect=10.0)

        async def make() -> Any:
            return httpx.AsyncClient(base_url=self.url, limits=limits, timeout=timeout)

        self.http = self.call(make())
        # coroutine functions closing what else talks on this loop (a gRPC channel), at close
        self.closing: list[Any] = []

    def call(self, coro: Any) -> Any:
        """Run ``coro`` on the client's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def spawn(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> Any:
        import httpx

        waited, backoff = 0.0, 0.1
        while True:
            try:
                r = await self.http.request(method, path, json=body, headers=headers)
            except httpx.HTTPError as e:
                raise SwarmError(f"{self.url}{path}: {type(e).__name__}: {e}") from None
            if r.status_code not in RETRY_STATUS or waited >= self.retry_s:
                break
            pause = min(retry_after(r.headers.get("retry-after"), backoff), self.retry_s - waited)
            self.retries += 1
            await asyncio.sleep(pause)
            waited += pause
            backoff = min(backoff * 2, 2.0)
        if r.status_code >= 400:
            raise SwarmError(f"{self.url}{path}: HTTP {r.status_code}: {error_detail(r.text)}")
        try:
            return r.json()
        except ValueError:
            raise SwarmError(f"{self.url}{path}: the answer is not JSON: {r.text[:80]!r}") from None

    def close(self) -> None:
        """Cancel what is still in flight (responses the run no longer waits for), then close."""

        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for close in self.closing:
                await close()
            await self.http.aclose()

        try:
            self.call(shutdown())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)


class HttpSessions:
    """``wispsim serve``'s session API over HTTP on ``client`` (a :class:`Client`): the coroutines
    the swarm's devices call (:class:`wispsim.serve.grpc_api.GrpcSessions` has the same ones over
    gRPC); its retries are the client's."""

    retries = 0  # counted by the client

    def __init__(self, client: Client) -> None:
        self.client = client

    async def open(self, prompt: list[int]) -> str:
        return str((await self.client.request("POST", "/sessions", {"prompt": prompt}))["session"])

    async def verify(self, session: str, body: dict[str, Any]) -> dict[str, Any]:
        return dict(await self.client.request("POST", f"/sessions/{session}/rounds", body))

    async def close(self, session: str) -> None:
        await self.client.request("DELETE", f"/sessions/{session}")


def error_detail(text: str) -> str:
    """What an error answer says: FastAPI's ``detail``, OpenAI's ``error.message``, else the text."""
    try:
        body = json.loads(text)
    except ValueError:
        return text[:200]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if body.get("detail"):
            return str(body["detail"])
    return text[:200]


def health(client: Client, samples: int = 8) -> tuple[dict[str, Any], float]:
    """The server's facts, and its clock's offset from this process's ``time.monotonic``: the
    server's reading minus the midpoint of the round trip, from the quickest of ``samples`` trips
    (as NTP does; the first trip also opens the connection)."""
    best = (float("inf"), 0.0)
    facts: dict[str, Any] = {}
    for _ in range(samples):
        t0 = time.monotonic()
        facts = client.call(client.request("GET", "/health"))
        t1 = time.monotonic()
        best = min(best, (t1 - t0, float(facts["clock"]) - (t0 + t1) / 2))
    return facts, best[1]


def check_server(sc: Scenario, client: Client) -> tuple[dict[str, Any], float]:
    """The server's facts and clock offset; a one-line error if it is unreachable or serves
    another policy than ``sc``'s."""
    from wispsim.sim.serving import serving_of

    facts, offset = health(client)
    want = serving_of(sc).name  # as /health names it
    if facts.get("mode") != want or facts.get("policy") != sc.policy:
        raise SwarmError(
            f"{client.url}: the server runs {facts.get('policy')} ({facts.get('mode')}), the swarm's "
            f"scenario {sc.policy} ({want}); start the server with --policy {sc.policy}"
        )
    return facts, offset
