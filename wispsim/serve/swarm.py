"""``wispsim swarm``: N devices against a real server, in one light process.

The devices are the simulator's own (:class:`wispsim.sim.device.Device`, wired by
:func:`wispsim.sim.simulation.simulate`): the same closed loop, the same per-device random streams,
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
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from wispsim.config import Scenario
from wispsim.results import Results
from wispsim.serve.client import (
    RETRY_STATUS,
    Client,
    HttpSessions,
    SwarmError,
    check_server,
    error_detail,
    retry_after,
)
from wispsim.serve.clock import WallClock
from wispsim.serve.server_side import ServerClients
from wispsim.sim.generation import Served
from wispsim.sim.records import BatchRecord, SimResult
from wispsim.sim.scenarios import Resolved
from wispsim.sim.serving import serving_of

# spawn key of the token ids a swarm sends (apart from the devices' streams)
TOKEN_STREAM = 7_000_003

__all__ = ["Client", "RemoteCentral", "RemoteVerifier", "Server", "SwarmError", "SwarmRun", "run_swarm"]


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

    def settle(self, event: Any, value: Any, at: float) -> None:
        """Succeed ``event`` with ``value`` at local time ``at`` (when the reply really came): the
        environment runs every event due before it first, so a busy SimPy thread that is behind
        the wall clock does not record the reply earlier than it came (nor before a first
        token's arrival)."""

        def schedule() -> None:
            self.env.timeout(max(0.0, at - self.env.now)).callbacks.append(lambda _: event.succeed(value))

        self.env.post(schedule)

    def fail(self, e: BaseException) -> None:
        def raise_it() -> None:
            raise e

        self.env.post(raise_it)


class RemoteVerifier(_Remote):
    """``ctx.server`` for the devices: each round goes to the real verification server through
    ``api``, its session API (``open``, ``verify``, ``close``): over HTTP
    (:class:`~wispsim.serve.client.HttpSessions`, the default) or over gRPC
    (:class:`wispsim.serve.grpc_api.GrpcSessions`, made on the client's loop)."""

    def __init__(
        self, env: WallClock, client: Client, offset: float, vocab: int, seed: int, api: Any = None
    ) -> None:
        super().__init__(env, client, offset, vocab, seed)
        self.sessions: dict[int, Any] = {}  # response -> concurrent future of its session id
        self.draws = 0
        self.api = api if api is not None else HttpSessions(client)

    async def _open(self, response: int, prompt_len: int) -> str:
        return str(await self.api.open(self.tokens(0, response, prompt_len)))

    async def _round(self, req: Any, body: dict[str, Any]) -> None:
        try:
            sid = await asyncio.wrap_future(self.sessions[req.session])
            reply = await self.api.verify(sid, body)
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
                await self.api.close(sid)
            except BaseException as e:
                self.fail(e)

        self.client.spawn(close())


class RemoteCentral(_Remote):
    """``ctx.server`` for the devices under centralized serving: each response is generated by the
    real centralized server,
    and every token's arrival is recorded."""

    def __init__(self, env: WallClock, client: Client, offset: float, vocab: int, seed: int) -> None:
        super().__init__(env, client, offset, vocab, seed)
        self.arrivals: list[tuple[int, int, float, float]] = []  # response, tokens, local t, server t
        self.preemptions = 0

    async def _generate(self, rid: int, prompt: int, output: int, done: Any) -> None:
        body = {"prompt": self.tokens(0, rid, prompt), "output_tokens": output}
        first = math.nan  # when the line with the first token arrived (done's value, as in the simulator)
        waited, backoff = 0.0, 0.1
        try:
            while True:
                async with self.client.http.stream("POST", "/generate", json=body) as r:
                    if r.status_code in RETRY_STATUS and waited < self.client.retry_s:
                        # the server is full: try again after it says (as Client.request does)
                        pause = min(
                            retry_after(r.headers.get("retry-after"), backoff), self.client.retry_s - waited
                        )
                        self.client.retries += 1
                        await r.aread()
                    elif r.status_code >= 400:
                        text = (await r.aread()).decode(errors="replace")
                        raise SwarmError(
                            f"{self.client.url}/generate: HTTP {r.status_code}: {error_detail(text)}"
                        )
                    else:
                        async for line in r.aiter_lines():
                            if line.strip():
                                item = json.loads(line)
                                if "error" in item:
                                    raise SwarmError(f"{self.client.url}/generate: {item['error']}")
                                now = time.monotonic() - self.env.origin
                                tokens = int(item["tokens"])
                                if tokens > 0 and math.isnan(first):
                                    first = now
                                self.arrivals.append((rid, tokens, now, self.local(float(item["t"]))))
                        break
                await asyncio.sleep(pause)
                waited += pause
                backoff = min(backoff * 2, 2.0)
        except BaseException as e:
            self.fail(e)
            return
        self.settle(done, Served(first, output), time.monotonic() - self.env.origin)

    def submit(self, g: Any) -> Any:
        """Generate ``g`` (a :class:`~wispsim.sim.centralized.Generation`) on the real server."""
        self.lags.append(self.env.wall() - self.env.now)
        self.client.spawn(self._generate(g.rid, g.prompt, g.output, g.done))
        return g.done


# the client of a real server that a device of each kind of serving talks to
REMOTES: dict[str, type[_Remote]] = {"speculative": RemoteVerifier, "centralized": RemoteCentral}


@dataclass
class SwarmRun:
    """A swarm's records (the simulator's, on the wall clock), the server's log and facts."""

    result: SimResult
    server_batches: pd.DataFrame
    members: pd.DataFrame
    tokens: pd.DataFrame
    facts: dict[str, Any]
    offset: float
    source: str = "wispsim serve"  # the real server, as the replay log's sidecar names it

    def write_records(self, folder: Results, prefix: str = "") -> None:
        """The records (``PREFIXrounds``, ``PREFIXresponses``, ``PREFIXbatches``, and for
        centralized ``PREFIXtokens``) and the server's log (``server_batches``,
        ``server_members``; not for a server that keeps none, such as an OpenAI-compatible one)
        as Parquet files in ``folder``."""
        r = self.result
        folder.table(f"{prefix}rounds.parquet", r.round_records)  # type: ignore[arg-type]
        folder.table(f"{prefix}responses.parquet", r.responses)
        folder.table(f"{prefix}batches.parquet", r.batches)
        if len(self.server_batches.columns):
            folder.table("server_batches.parquet", self.server_batches)
        if len(self.members):
            folder.table("server_members.parquet", self.members)
        if len(self.tokens):
            folder.table(f"{prefix}tokens.parquet", self.tokens)

    def write_log(self, path: Path) -> Path | None:
        """The replay log of a speculative run (``docs/replay.md``), its sidecar naming the real
        server; None for centralized serving (no rounds)."""
        from wispsim.study.replay import write_log
        from wispsim.study.replay.log import meta_path

        r = self.result
        if not len(r.round_records):  # centralized serving has no rounds
            return None
        write_log(r, path)
        side = meta_path(path)
        meta = json.loads(side.read_text())
        meta |= {"source": f"wispsim swarm + {self.source}", "server": self.facts}
        side.write_text(json.dumps(meta, indent=1))
        return path


class Server(Protocol):
    """The real server a swarm drives: how to check it, the ``ctx.server`` its
    devices talk to, and its log at the end. :class:`WispsimServer` here;
    :class:`wispsim.serve.openai.OpenAIServer` for an OpenAI-compatible one."""

    url: str
    source: str  # named in the replay log's sidecar
    read_timeout: float  # the longest wait for a reply (or, streaming, for its next line)

    def connect(self, sc: Scenario, client: Client) -> tuple[dict[str, Any], float]:
        """The server's facts and its clock's offset; a one-line error if it cannot serve ``sc``."""
        ...

    def remote(
        self, sc: Scenario, env: WallClock, client: Client, offset: float, facts: dict[str, Any], seed: int
    ) -> _Remote: ...

    def log(self, client: Client) -> dict[str, Any]:
        """The server's batch log: ``batches`` and ``members`` rows (empty lists if it keeps none)."""
        ...


class WispsimServer:
    """``wispsim serve`` at ``url``: checked by ``/health`` (mode and policy), emptied by
    ``/reset`` at the start (``reset``), its batch log read from ``/log``; both need the server's
    admin ``token``."""

    source = "wispsim serve"
    read_timeout = 600.0

    def __init__(self, url: str, reset: bool = True, token: str | None = None) -> None:
        self.url = url
        self.reset = reset
        self.token = token

    def _admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def connect(self, sc: Scenario, client: Client) -> tuple[dict[str, Any], float]:
        facts, offset = check_server(sc, client)
        if self.reset:
            client.call(client.request("POST", "/reset", headers=self._admin()))
        return facts, offset

    def remote(
        self, sc: Scenario, env: WallClock, client: Client, offset: float, facts: dict[str, Any], seed: int
    ) -> _Remote:
        kind = REMOTES[serving_of(sc).name]
        extra: dict[str, Any] = {}
        if kind is RemoteVerifier and sc.server.host.transport == "grpc":
            port = facts.get("grpc_port")
            if not port:
                raise SwarmError(
                    f"{self.url}: the scenario's devices speak gRPC (server.build {sc.server.build}) and "
                    "the server serves none; start it on the same scenario, or with --grpc-port"
                )
            from wispsim.serve.grpc_api import sessions_on

            extra["api"] = sessions_on(client, f"{urlsplit(self.url).hostname or '127.0.0.1'}:{port}")
        return kind(env, client, offset, int(facts["vocab"]), seed, **extra)

    def log(self, client: Client) -> dict[str, Any]:
        return dict(client.call(client.request("GET", "/log", headers=self._admin())))


def probe(sc: Scenario, server: str | Server) -> dict[str, Any]:
    """The server's facts, checked for ``sc`` (:meth:`Server.connect`), on a short-lived client
    (before a progress bar starts); a URL is ``wispsim serve``'s. Nothing is reset."""
    if isinstance(server, str):
        target: Server = WispsimServer(server, reset=False)
    elif isinstance(server, WispsimServer):
        target = WispsimServer(server.url, reset=False, token=server.token)
    else:
        target = server
    client = Client(target.url, 1, target.read_timeout)
    try:
        return target.connect(sc, client)[0]
    finally:
        client.close()


def run_swarm(
    resolved: Resolved,
    server: str | Server,
    devices: int | None = None,
    seed: int | None = None,
    progress: Callable[[float, float], None] | None = None,
    reset: bool = True,
) -> SwarmRun:
    """Run ``devices`` devices of a resolved scenario (:func:`wispsim.runs.resolve.resolve`)
    against ``server`` (a :class:`Server`, or the URL of ``wispsim serve``, reset first if
    ``reset``) for the scenario's window (and its drain), then fetch the server's batch log."""
    from wispsim.sim.simulation import simulate

    scenario = resolved.scenario
    if isinstance(server, str):
        target: Server = WispsimServer(server, reset)
    elif isinstance(server, WispsimServer):
        target = WispsimServer(server.url, reset and server.reset, server.token)
    else:
        target = server
    n = devices if devices is not None else scenario.devices.count
    client = Client(target.url, n, target.read_timeout)
    try:
        facts, offset = target.connect(scenario, client)
        env = WallClock()
        run_seed = scenario.seed if seed is None else seed
        side = ServerClients(
            env, lambda: target.remote(scenario, env, client, offset, facts, run_seed), n, progress
        )
        res = simulate(resolved, n, seed, servers=side, env=env)
        log = target.log(client)
    finally:
        client.close()
    srv_batches = pd.DataFrame(log["batches"])
    members = pd.DataFrame(log["members"])
    dropped = int(log.get("dropped_batches", 0)) + int(log.get("dropped_members", 0))
    if len(srv_batches):
        for col in ("t_dispatch", "t_end"):
            srv_batches[col] = srv_batches[col] - offset - env.origin
    fields = list(BatchRecord._fields)
    res.batches = (
        # the server logs no GPU/CPU split of a batch: those columns are unknown (NaN)
        srv_batches.reindex(columns=fields).reset_index(drop=True)
        if len(srv_batches)
        else pd.DataFrame(columns=fields)
    )
    r = side.remote
    tokens = pd.DataFrame(
        getattr(r, "arrivals", []),
        columns=["response", "tokens", "t", "t_server"],
    )
    lags = np.asarray(r.lags if r is not None else [], dtype=float)
    res.info |= {
        "server": facts,
        "clock_offset_s": offset,
        # the swarm's own timing: how far behind their simulated send time requests really left
        "send_lag_p50_ms": float(np.median(lags) * 1000) if len(lags) else float("nan"),
        "send_lag_p99_ms": float(np.quantile(lags, 0.99) * 1000) if len(lags) else float("nan"),
        # requests the server asked to retry (429/503) and the swarm did; log rows it let go
        "retries": client.retries + getattr(getattr(r, "api", None), "retries", 0),
        "server_log_dropped": dropped,
    }
    return SwarmRun(res, srv_batches, members, tokens, facts, offset, target.source)
