"""``wispsim swarm``: N devices against a real server, in one light process.

The devices are the simulator's own (:class:`wispsim.sim.device.Device`, wired by
:func:`wispsim.sim.engine.simulate`): the same closed loop, the same per-device random streams,
acceptance replayed from the same trace, the same drafting controller, drafting time (tau_d times
the forward passes plus predictor calls) and link delays. Only two things change: time is the
wall clock (:class:`~wispsim.serve.clock.WallClock`, so every wait really waits), and the server
is the real one, reached over HTTP (:class:`RemoteVerifier`, :class:`RemoteCentral`). So the
records a swarm writes are the simulator's records, on the wall clock, with the real server's
queue and verify times, batch ids and the cached tokens vLLM reported; the replay log is written
from them by :func:`wispsim.study.replay.write_log`, as ``wispsim run --log`` writes it.

Clocks: the server stamps its own clock (``time.monotonic`` there). The swarm estimates the offset
from a round trip at start (``GET /health``: the server's clock minus the midpoint of the trip) and
puts the server's dispatch times on its own origin; on one host the offset is zero within that
round trip.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wispsim.config import Scenario
from wispsim.errors import WispsimError
from wispsim.serve.clock import WallClock
from wispsim.sim.context import RunContext
from wispsim.sim.records import BatchRecord, SimResult

# spawn key of the token ids a swarm sends (apart from the devices' streams)
TOKEN_STREAM = 7_000_003


class SwarmError(WispsimError):
    pass


class Client:
    """An HTTP client on its own thread and asyncio loop (httpx), for the SimPy thread to call."""

    def __init__(self, url: str, connections: int) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="wispsim-swarm-http", daemon=True)
        self._thread.start()
        limits = httpx.Limits(max_connections=connections + 4, max_keepalive_connections=connections + 4)
        timeout = httpx.Timeout(600.0, connect=10.0)

        async def make() -> Any:
            return httpx.AsyncClient(base_url=self.url, limits=limits, timeout=timeout)

        self.http = self.call(make())

    def call(self, coro: Any) -> Any:
        """Run ``coro`` on the client's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def spawn(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        import httpx

        try:
            r = await self.http.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise SwarmError(f"{self.url}{path}: {type(e).__name__}: {e}") from None
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text
            raise SwarmError(f"{self.url}{path}: HTTP {r.status_code}: {detail}")
        return r.json()

    def close(self) -> None:
        try:
            self.call(self.http.aclose())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)


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


class _Remote:
    def __init__(self, env: WallClock, client: Client, offset: float, vocab: int, seed: int) -> None:
        self.env = env
        self.client = client
        self.offset = offset
        self.vocab = vocab
        self.seed = seed
        self.error: BaseException | None = None
        self.lags: list[float] = []  # how late each request left, behind its simulated time
        self.fleet = 0  # devices in the run (set by run_swarm)

    def local(self, server_time: float) -> float:
        """A server clock reading on this environment's time axis."""
        return server_time - self.offset - self.env.origin

    def tokens(self, kind: int, key: int, n: int) -> list[int]:
        """``n`` token ids: a prompt (``kind`` 0, ``key`` the response) or a draft (1, the round's
        number); reproducible, different for every fleet size (so the points of a grid never
        share a prompt through the engine's prefix cache), the first 100 ids left out as special
        tokens."""
        key_ = (TOKEN_STREAM, self.fleet, kind, key)
        rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=key_))
        low = min(100, self.vocab - 1)
        return rng.integers(low, self.vocab, size=n).tolist()

    def fail(self, e: BaseException) -> None:
        def raise_it() -> None:
            raise e

        self.env.post(raise_it)


class RemoteVerifier(_Remote):
    """``ctx.server`` for the devices: each round goes to the real verification server."""

    def __init__(self, env: WallClock, client: Client, offset: float, vocab: int, seed: int) -> None:
        super().__init__(env, client, offset, vocab, seed)
        self.sessions: dict[int, Any] = {}  # response -> concurrent future of its session id
        self.draws = 0

    async def _open(self, response: int, prompt_len: int) -> int:
        reply = await self.client.request(
            "POST", "/sessions", {"prompt": self.tokens(0, response, prompt_len)}
        )
        return int(reply["session"])

    async def _round(self, req: Any, body: dict[str, Any]) -> None:
        try:
            sid = await asyncio.wrap_future(self.sessions[req.session])
            reply = await self.client.request("POST", f"/sessions/{sid}/rounds", body)
        except BaseException as e:
            self.fail(e)
            return

        def finish() -> None:
            # the server's own stamps: queue time is its dispatch minus its arrival, so neither
            # the HTTP transit nor a late send by this process counts as queueing
            req.arrival = max(req.arrival, self.local(reply["t_arrival"]))
            req.dispatch = self.local(reply["t_dispatch"])
            req.verify_time = float(reply["verify_s"])
            req.batch = int(reply["batch"])
            req.l_new = int(reply["l_new"])
            req.l_cached = int(reply["l_cached"])
            req.cold = req.l_cached == 0
            req.done.succeed()

        self.env.post(finish)

    def submit(self, req: Any) -> Any:
        self.lags.append(self.env.wall() - self.env.now)
        if req.session not in self.sessions:
            self.sessions[req.session] = self.client.spawn(self._open(req.session, req.prefix))
        commit = req.prefix_after - req.prefix
        self.draws += 1
        body = {
            "draft": self.tokens(1, self.draws, req.k),
            "accepted": commit - 1,
            "commit": commit,
            "budget_s": req.deadline - req.arrival,
            "n_hat": req.n_hat,
        }
        self.client.spawn(self._round(req, body))
        return req.done

    def drop(self, session: int) -> None:
        fut = self.sessions.pop(session, None)
        if fut is None:
            return

        async def close() -> None:
            try:
                sid = await asyncio.wrap_future(fut)
                await self.client.request("DELETE", f"/sessions/{sid}")
            except BaseException as e:
                self.fail(e)

        self.client.spawn(close())


class RemoteCentral(_Remote):
    """``ctx.central`` for the devices: each response is generated by the real centralized server,
    and every token's arrival is recorded."""

    def __init__(self, env: WallClock, client: Client, offset: float, vocab: int, seed: int) -> None:
        super().__init__(env, client, offset, vocab, seed)
        self.arrivals: list[tuple[int, int, float, float]] = []  # response, tokens, local t, server t
        self.preemptions = 0

    async def _generate(self, rid: int, prompt: int, output: int, done: Any) -> None:
        import json

        body = {"prompt": self.tokens(0, rid, prompt), "output_tokens": output}
        first = math.nan  # when the line with the first token arrived (done's value, as in the simulator)
        try:
            async with self.client.http.stream("POST", "/generate", json=body) as r:
                if r.status_code >= 400:
                    text = (await r.aread()).decode(errors="replace")
                    raise SwarmError(f"{self.client.url}/generate: HTTP {r.status_code}: {text}")
                async for line in r.aiter_lines():
                    if line.strip():
                        item = json.loads(line)
                        now = time.monotonic() - self.env.origin
                        tokens = int(item["tokens"])
                        if tokens > 0 and math.isnan(first):
                            first = now
                        self.arrivals.append((rid, tokens, now, self.local(float(item["t"]))))
        except BaseException as e:
            self.fail(e)
            return
        self.env.post(functools.partial(done.succeed, first))

    def submit(self, rid: int, prompt: int, output: int, done: Any) -> None:
        self.lags.append(self.env.wall() - self.env.now)
        self.client.spawn(self._generate(rid, prompt, output, done))


@dataclass
class SwarmRun:
    """A swarm's records (the simulator's, on the wall clock), the server's log and facts."""

    result: SimResult
    server_batches: pd.DataFrame
    members: pd.DataFrame
    tokens: pd.DataFrame
    facts: dict[str, Any]
    offset: float

    def write_records(self, folder: Path, prefix: str = "") -> None:
        """The records (``PREFIXrounds``, ``PREFIXresponses``, ``PREFIXbatches``, and for
        centralized ``PREFIXtokens``) and the server's log (``server_batches``,
        ``server_members``) as Parquet files in ``folder``."""
        r = self.result
        r.round_records.to_parquet(folder / f"{prefix}rounds.parquet")
        r.responses.to_parquet(folder / f"{prefix}responses.parquet", index=False)
        r.batches.to_parquet(folder / f"{prefix}batches.parquet", index=False)
        self.server_batches.to_parquet(folder / "server_batches.parquet", index=False)
        if len(self.members):
            self.members.to_parquet(folder / "server_members.parquet", index=False)
        if len(self.tokens):
            self.tokens.to_parquet(folder / f"{prefix}tokens.parquet", index=False)

    def write_log(self, path: Path) -> Path | None:
        """The replay log of a speculative run (``docs/replay.md``), its sidecar naming the real
        server; None for centralized serving (no rounds)."""
        from wispsim.study.replay import write_log
        from wispsim.study.replay.log import meta_path

        r = self.result
        if r.scenario.server.mode == "centralized" or not len(r.round_records):
            return None
        write_log(r, path)
        side = meta_path(path)
        meta = json.loads(side.read_text())
        meta |= {"source": "wispsim swarm + wispsim serve", "server": self.facts}
        side.write_text(json.dumps(meta, indent=1))
        return path


def check_server(sc: Scenario, client: Client) -> tuple[dict[str, Any], float]:
    """The server's facts and clock offset; a one-line error if it is unreachable or serves
    another policy than ``sc``'s."""
    facts, offset = health(client)
    want = "centralized" if sc.server.mode == "centralized" else "speculative"
    if facts.get("mode") != want or facts.get("policy") != sc.policy:
        raise SwarmError(
            f"{client.url}: the server runs {facts.get('policy')} ({facts.get('mode')}), the swarm's "
            f"scenario {sc.policy} ({want}); start the server with --policy {sc.policy}"
        )
    return facts, offset


def probe(sc: Scenario, url: str) -> dict[str, Any]:
    """:func:`check_server` on a short-lived client (before a progress bar starts)."""
    client = Client(url, 1)
    try:
        return check_server(sc, client)[0]
    finally:
        client.close()


def run_swarm(
    sc: Scenario,
    url: str,
    devices: int | None = None,
    seed: int | None = None,
    progress: Callable[[float, float], None] | None = None,
    reset: bool = True,
) -> SwarmRun:
    """Run ``devices`` devices of ``sc`` against the server at ``url`` for the scenario's window
    (and its drain), then fetch the server's batch log."""
    from wispsim.sim.engine import simulate

    n = devices if devices is not None else sc.devices.count
    client = Client(url, n)
    try:
        facts, offset = check_server(sc, client)
        if reset:
            client.call(client.request("POST", "/reset"))
        env = WallClock()
        vocab = int(facts["vocab"])
        remote: dict[str, Any] = {}
        run_seed = sc.seed if seed is None else seed

        def wire(ctx: RunContext) -> None:
            if sc.server.mode == "centralized":
                ctx.central = remote["r"] = RemoteCentral(env, client, offset, vocab, run_seed)
            else:
                ctx.server = remote["r"] = RemoteVerifier(env, client, offset, vocab, run_seed)
            remote["r"].fleet = n
            if progress is not None:
                env.process(_ticker(env, ctx, progress))

        res = simulate(sc, n, seed, env=env, remote=wire)
        log = client.call(client.request("GET", "/log"))
    finally:
        client.close()
    srv_batches = pd.DataFrame(log["batches"])
    members = pd.DataFrame(log["members"])
    if len(srv_batches):
        for col in ("t_dispatch", "t_end"):
            srv_batches[col] = srv_batches[col] - offset - env.origin
    fields = list(BatchRecord._fields)
    res.batches = (
        srv_batches[fields].reset_index(drop=True) if len(srv_batches) else pd.DataFrame(columns=fields)
    )
    r = remote.get("r")
    tokens = pd.DataFrame(
        r.arrivals if isinstance(r, RemoteCentral) else [],
        columns=["response", "tokens", "t", "t_server"],
    )
    lags = np.asarray(r.lags if r is not None else [], dtype=float)
    res.info |= {
        "server": facts,
        "clock_offset_s": offset,
        # the swarm's own timing: how far behind their simulated send time requests really left
        "send_lag_p50_ms": float(np.median(lags) * 1000) if len(lags) else float("nan"),
        "send_lag_p99_ms": float(np.quantile(lags, 0.99) * 1000) if len(lags) else float("nan"),
    }
    return SwarmRun(res, srv_batches, members, tokens, facts, offset)


def _ticker(env: WallClock, ctx: RunContext, progress: Callable[[float, float], None]) -> Any:
    end = ctx.window[1]
    while True:
        progress(env.now, end)
        yield env.timeout(1.0)
