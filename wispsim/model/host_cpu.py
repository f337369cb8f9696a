"""The serving host's CPU: what the engine core and the API server spend besides the GPU (issue 36).

A vLLM deployment is two kinds of process on the GPU server's CPU (``vllm serve``): the **engine
core** (scheduler, KV-cache manager, block hashing, the model runner's input preparation), one per
replica, and ``api_server_count`` **API servers** (HTTP, JSON, input and output processing,
tokenization of text prompts) in front of it. Both were measured on vLLM's CPU backend by
``benchmarks/vllm/round_cost.py`` and ``api_cost.py`` (the same Python that runs beside a GPU);
``wispsim experiment run round-cost`` fits them and writes ``wispsim/data/host_cpu.yaml``.

**Engine core**, per step (a verification batch, a decode/prefill step)::

    cpu = step + request * N_requests + arrival * N_new + session * N_resident + token * N_hashed

``N_new``: requests arriving anew (every re-submitted verification round; a response's first
prefill chunk), which hash their whole prompt (``N_hashed``); ``N_resident``: rounds of a
session-resident verifier (``server.verifier.kind: resident``), which hash only their new tokens.
Without async scheduling the engine core runs the step's CPU work and then the GPU's, so a step
takes ``cpu + gpu``; with it (``server.engine.async_scheduling``, vLLM's default where supported) the CPU
work of the next step runs while the GPU runs this one, and a step takes ``max(cpu, gpu)``: the
CPU caps steps per second instead of lengthening them.

**API server**: each request a serial process handles before the engine sees it, ``request`` (a
re-submitted round through vLLM's OpenAI server: HTTP, JSON, input and output processing) or, for a
resident round, what a session API on vLLM's engine spends on it: ``session`` over HTTP (JSON) and
``grpc_session`` over gRPC (protobuf), as ``server.host.transport`` says (the verifier's build,
:mod:`wispsim.config.builds`; ``benchmarks/vllm/transport_cost.py`` measured both on one server,
the engine's own CPU taken out), plus ``ids`` per prompt token sent as token ids (parsing and
validating the list: a re-submitted round sends its whole sequence, a resident round its new
tokens) or ``text`` per prompt token sent as text (tokenization). ``api_server_count`` processes
share the requests by connection (a device's requests go to one process). A response's tokens come
back through the same process: ``step`` per engine step whose outputs it receives (the engine
core's message, walked once), ``token`` per output token (detokenizing: vLLM V1's output processor
runs there), ``output`` per response and step (its ``RequestOutput`` made and handed to the
response's collector) and ``chunk`` per streamed chunk (the response's task takes what its
collector holds and writes one server-sent event), serial with the rest
(``benchmarks/vllm/stream_cost.py``); a process that falls behind merges a response's outputs
into fewer chunks, which saves ``chunk`` and nothing else (``benchmarks/vllm/merge_cost.py``;
:mod:`wispsim.sim.front`). The chat endpoint adds ``chat`` per request (its template).

All times are the measuring host's, divided by ``server.host.cpu_speed`` (2 = a CPU twice as fast).
The measuring host is a 2-core cloud VM, slower than a GPU server's CPU: at speed 1 these costs
are upper bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from wispsim.errors import ConfigError
from wispsim.paths import data_dir as package_data

if TYPE_CHECKING:
    from wispsim.config.server import ServerConfig

T = TypeVar("T")

ENGINE_TERMS = ("step", "request", "arrival", "session", "token")
API_TERMS = ("request", "session", "ids", "text", "step", "token", "output", "chunk", "chat")


@dataclass(frozen=True, slots=True)
class HostFacts:
    """What a profile knows of the serving host it was calibrated on, apart from its GPUs: the
    front end's latency (HTTP and tokenization before the engine sees a request, seconds:
    ``roofline.overhead_ms.frontend``) and the host CPU's speed over the measuring host's
    (``roofline.host_cpu_speed``; None: calibrated without the host-CPU model). Host facts, not
    GPU time: they live on the profile, not on its cost form."""

    frontend: float = 0.0
    cpu_speed: float | None = None


@dataclass(frozen=True, slots=True)
class HostCPU:
    """The measured CPU costs (seconds, already divided by the host's speed)."""

    step: float
    request: float
    arrival: float
    session: float
    token: float
    api_request: float
    api_session: float
    api_ids: float
    api_text: float
    api_step: float = 0.0
    api_token: float = 0.0
    api_chunk: float = 0.0
    api_chat: float = 0.0
    api_output: float = 0.0
    api_servers: int = 1
    async_scheduling: bool = False

    def engine(self, requests: int, arrivals: int, sessions: int, hashed: int) -> float:
        """The engine core's CPU seconds for one step."""
        return (
            self.step
            + self.request * requests
            + self.arrival * arrivals
            + self.session * sessions
            + self.token * hashed
        )

    def step_time(self, gpu: float, cpu: float) -> float:
        """A step's wall time given its GPU and engine-core CPU seconds (module docstring)."""
        if self.async_scheduling:
            return gpu if gpu >= cpu else cpu
        return gpu + cpu

    def api(self, resident: bool, ids: int = 0, text: int = 0, chat: bool = False) -> float:
        """An API server's CPU seconds for one request carrying ``ids`` prompt tokens as token ids
        (a verification round) and ``text`` as text (a user's prompt, tokenized; ``chat``: through
        the chat endpoint, its template applied)."""
        return (
            (self.api_session if resident else self.api_request)
            + self.api_ids * ids
            + self.api_text * text
            + (self.api_chat if chat else 0.0)
        )

    def output(self, tokens: int) -> float:
        """An API server's CPU seconds for handling one response's output of ``tokens`` tokens from
        a step (detokenized, made a ``RequestOutput`` and handed to the response's collector; the
        step's message is :attr:`api_step`, once per step and process). Writing it out is
        :attr:`api_chunk` a chunk, and a chunk carries every output its collector merged."""
        return self.api_output + self.api_token * tokens


@cache
def measured_terms() -> dict[str, Any]:
    """``wispsim/data/host_cpu.yaml`` as written by the round-cost study."""
    path = package_data() / "host_cpu.yaml"
    data = yaml.safe_load(path.read_text())
    for section, terms in (("engine_core_ms", ENGINE_TERMS), ("api_server_ms", API_TERMS)):
        got = data.get(section) or {}
        missing = [t for t in terms if not isinstance(got.get(t), int | float)]
        if missing:
            raise ConfigError(str(path), section, f"lacks {', '.join(missing)} (ms)")
    return data


def host_cpu(
    speed: float = 1.0, api_servers: int = 1, async_scheduling: bool = False, transport: str = "http"
) -> HostCPU:
    """The shipped host CPU (``wispsim/data/host_cpu.yaml``) at ``speed`` times the measuring
    host's; ``transport`` (``server.host.transport``): how rounds reach the API servers, whose
    resident round costs ``session`` over HTTP and ``grpc_session`` over gRPC."""
    data = measured_terms()
    e, a = data["engine_core_ms"], data["api_server_ms"]
    session = a["grpc_session"] if transport == "grpc" else a["session"]
    s = 1e-3 / speed
    return HostCPU(
        step=e["step"] * s,
        request=e["request"] * s,
        arrival=e["arrival"] * s,
        session=e["session"] * s,
        token=e["token"] * s,
        api_request=a["request"] * s,
        api_session=session * s,
        api_ids=a["ids"] * s,
        api_text=a["text"] * s,
        api_step=a["step"] * s,
        api_token=a["token"] * s,
        api_chunk=a["chunk"] * s,
        api_chat=a["chat"] * s,
        api_output=a["output"] * s,
        api_servers=api_servers,
        async_scheduling=async_scheduling,
    )


def for_server(server: ServerConfig, facts: HostFacts) -> HostCPU | None:
    """The host CPU a replica of ``server`` runs on, or None where it is not modelled.

    ``server.host.cpu``: ``auto`` models it where the profile's engine overheads were calibrated
    beside it (a profile whose host facts name a CPU speed), not for a measured profile, whose
    timings include it; ``on`` always, ``off`` never. The speed is ``server.host.cpu_speed``
    where set, else the profile's calibrated host's, else the measuring host's (1)."""
    calibrated = facts.cpu_speed
    mode = server.host.cpu
    if mode == "off" or (mode == "auto" and calibrated is None):
        return None
    speed = server.host.cpu_speed or calibrated or 1.0
    return host_cpu(
        speed, server.host.api_server_count, server.engine.async_scheduling, server.host.transport
    )
