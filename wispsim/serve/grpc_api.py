"""The verification service over gRPC (``wispsim serve --grpc-port``; the ``wisp-grpc`` build).

The WISP paper's devices talk to the verifier over gRPC. This is the same session API as the HTTP
one (:mod:`wispsim.serve.app`), on the same verification server, as protobuf messages over gRPC
(``grpcio``, asyncio): service ``wispsim.verify.v1.Verifier`` with

- ``Open(OpenRequest{prompt})`` -> ``OpenReply{session}``
- ``Verify(RoundRequest{session, draft, accepted, commit, budget_s, n_hat})`` -> ``RoundReply``
  (the HTTP reply's fields: the verdict, the server's stamps, the batch, L_new / L_cached as
  served and as planned)
- ``Close(CloseRequest{session})`` -> ``CloseReply{}``

The messages are built at import from their descriptor (:data:`PROTO` says the same in ``.proto``
form), so nothing is generated at build time and only the protobuf runtime is needed. A request
is checked by the HTTP body's own model (one rule for both), and an error is the HTTP one's: its
status maps to a gRPC code (:data:`CODES`), its one-line detail is the status details, and the
HTTP status and any ``Retry-After`` travel as trailing metadata (``http-status``,
``retry-after``), so a client retries a 429 or 503 the same way on both. The admin routes
(``/log``, ``/reset``) and ``/health`` stay on HTTP, where ``/health`` says the gRPC port.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "wispsim.verify.v1"
SERVICE = f"{PACKAGE}.Verifier"
PROTO = """syntax = "proto3";
package wispsim.verify.v1;
service Verifier {
  rpc Open(OpenRequest) returns (OpenReply);
  rpc Verify(RoundRequest) returns (RoundReply);
  rpc Close(CloseRequest) returns (CloseReply);
}
message OpenRequest { repeated int32 prompt = 1; }
message OpenReply { string session = 1; }
message RoundRequest { string session = 1; repeated int32 draft = 2; int32 accepted = 3;
  int32 commit = 4; double budget_s = 5; double n_hat = 6; }
message RoundReply { int32 accepted = 1; int32 committed = 2; int32 bonus_token = 3;
  double t_arrival = 4; double t_dispatch = 5; double t_done = 6; double queue_s = 7;
  double verify_s = 8; int64 batch = 9; int32 batch_size = 10; int32 l_new = 11;
  int32 l_cached = 12; int32 l_new_plan = 13; int32 l_cached_plan = 14; }
message CloseRequest { string session = 1; }
message CloseReply {}
"""
_F = descriptor_pb2.FieldDescriptorProto
_TYPES = {"int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64, "double": _F.TYPE_DOUBLE, "string": _F.TYPE_STRING}
# each message's fields, numbered in order: "[repeated] TYPE NAME", as PROTO says them
MESSAGES: dict[str, list[str]] = {
    "OpenRequest": ["repeated int32 prompt"],
    "OpenReply": ["string session"],
    "RoundRequest": ["string session", "repeated int32 draft", "int32 accepted", "int32 commit",
                     "double budget_s", "double n_hat"],
    "RoundReply": ["int32 accepted", "int32 committed", "int32 bonus_token", "double t_arrival",
                   "double t_dispatch", "double t_done", "double queue_s", "double verify_s", "int64 batch",
                   "int32 batch_size", "int32 l_new", "int32 l_cached", "int32 l_new_plan",
                   "int32 l_cached_plan"],
    "CloseRequest": ["string session"],
    "CloseReply": [],
}  # fmt: skip
REPLY_FIELDS = [f.split()[-1] for f in MESSAGES["RoundReply"]]
# an HTTP status of the session API -> its gRPC code (grpc.StatusCode's name)
CODES = {
    401: "UNAUTHENTICATED",
    404: "NOT_FOUND",
    409: "FAILED_PRECONDITION",
    413: "RESOURCE_EXHAUSTED",
    422: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    503: "UNAVAILABLE",
}


def _messages() -> dict[str, Any]:
    f = descriptor_pb2.FileDescriptorProto(name="wispsim/verify/v1.proto", package=PACKAGE, syntax="proto3")
    for name, fields in MESSAGES.items():
        m = f.message_type.add(name=name)
        for number, spec in enumerate(fields, 1):
            *repeated, kind, field = spec.split()
            label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            m.field.add(name=field, number=number, type=_TYPES[kind], label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in MESSAGES
    }


M = _messages()


def reply_message(reply: dict[str, Any]) -> Any:
    """A served round's reply (:func:`wispsim.serve.rounds.reply`) as a ``RoundReply``."""
    return M["RoundReply"](**{k: reply[k] for k in REPLY_FIELDS})


def reply_dict(message: Any) -> dict[str, Any]:
    """A ``RoundReply`` as the HTTP reply's dict."""
    return {k: getattr(message, k) for k in REPLY_FIELDS}


def add_verifier(server: Any, verifier: Callable[[], Any], max_body_bytes: int) -> None:
    """Serve the verification API on ``server`` (a ``grpc.aio.Server``); ``verifier()`` is the
    running :class:`wispsim.serve.verify.VerifyServer` (None until the app has started one)."""
    import grpc
    from pydantic import ValidationError

    from wispsim.serve.bodies import OpenBody, RoundBody, validation_line
    from wispsim.serve.rounds import ServeError

    async def fail(context: Any, path: str, e: ServeError | ValidationError) -> None:
        if isinstance(e, ValidationError):
            e = ServeError(422, validation_line(path, e.errors()))
        meta = [("http-status", str(e.status))]
        if e.retry_after is not None:
            meta.append(("retry-after", f"{max(1, round(e.retry_after))}"))
        context.set_trailing_metadata(tuple(meta))
        await context.abort(getattr(grpc.StatusCode, CODES.get(e.status, "INTERNAL")), str(e))

    def running() -> Any:
        v = verifier()
        if v is None:
            raise ServeError(503, "the verification server is starting", retry_after=1.0)
        return v

    async def open_session(request: Any, context: Any) -> Any:
        try:
            body = OpenBody(prompt=list(request.prompt))
            return M["OpenReply"](session=running().open_session(body.prompt))
        except (ServeError, ValidationError) as e:
            await fail(context, "Open", e)

    async def verify(request: Any, context: Any) -> Any:
        try:
            body = RoundBody(draft=list(request.draft), accepted=request.accepted, commit=request.commit,
                             budget_s=request.budget_s, n_hat=request.n_hat)  # fmt: skip
            reply = await running().verify(
                request.session, body.draft, body.accepted, body.commit, body.budget_s, body.n_hat
            )
            return reply_message(reply)
        except (ServeError, ValidationError) as e:
            await fail(context, "Verify", e)

    async def close_session(request: Any, context: Any) -> Any:
        try:
            running().close_session(request.session)
            return M["CloseReply"]()
        except ServeError as e:
            await fail(context, "Close", e)

    def unary(fn: Any, req: str, rep: str) -> Any:
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=M[req].FromString, response_serializer=M[rep].SerializeToString
        )

    handlers = {
        "Open": unary(open_session, "OpenRequest", "OpenReply"),
        "Verify": unary(verify, "RoundRequest", "RoundReply"),
        "Close": unary(close_session, "CloseRequest", "CloseReply"),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


def server_options(max_body_bytes: int) -> list[tuple[str, int]]:
    """A ``grpc.aio.server``'s options: a message over ``max_body_bytes`` is refused before it is
    read whole (RESOURCE_EXHAUSTED), as the HTTP side's 413."""
    return [("grpc.max_receive_message_length", max_body_bytes)]


class GrpcSessions:
    """A client of the gRPC service (the swarm's devices, the cost harness): ``open``,
    ``verify``, ``close`` as coroutines on one channel, made on the loop that awaits them. A 429
    or 503 is tried again after its ``retry-after`` as on HTTP (:mod:`wispsim.serve.client`);
    any other failure raises ``error(text)`` with one line naming the target."""

    def __init__(self, target: str, error: Callable[[str], BaseException], retry_s: float = 60.0) -> None:
        import grpc

        self.target = target
        self.error = error
        self.retry_s = retry_s
        self.retries = 0
        self.channel = grpc.aio.insecure_channel(target)
        call = self.channel.unary_unary
        path = f"/{SERVICE}/"
        self._open = call(path + "Open", M["OpenRequest"].SerializeToString, M["OpenReply"].FromString)
        self._verify = call(path + "Verify", M["RoundRequest"].SerializeToString, M["RoundReply"].FromString)
        self._close = call(path + "Close", M["CloseRequest"].SerializeToString, M["CloseReply"].FromString)

    async def _call(self, method: Any, name: str, message: Any) -> Any:
        import asyncio

        import grpc

        from wispsim.serve.client import RETRY_STATUS, retry_after

        waited, backoff = 0.0, 0.1
        while True:
            try:
                return await method(message)
            except grpc.aio.AioRpcError as e:
                meta = dict(e.trailing_metadata() or ())
                status = int(meta.get("http-status", 0) or 0)
                if status in RETRY_STATUS and waited < self.retry_s:
                    pause = retry_after(meta.get("retry-after"), backoff)
                    self.retries += 1
                    await asyncio.sleep(pause)
                    waited, backoff = waited + pause, min(backoff * 2, 2.0)
                    continue
                raise self.error(f"grpc://{self.target} {name}: {e.code().name}: {e.details()}") from None

    async def open(self, prompt: list[int]) -> str:
        return str((await self._call(self._open, "Open", M["OpenRequest"](prompt=prompt))).session)

    async def verify(self, session: str, body: dict[str, Any]) -> dict[str, Any]:
        message = M["RoundRequest"](session=session, **body)
        return reply_dict(await self._call(self._verify, "Verify", message))

    async def close(self, session: str) -> None:
        await self._call(self._close, "Close", M["CloseRequest"](session=session))

    async def aclose(self) -> None:
        await self.channel.close()


def sessions_on(client: Any, target: str) -> GrpcSessions:
    """A :class:`GrpcSessions` to ``target`` made on ``client``'s loop (a
    :class:`wispsim.serve.client.Client`, which closes it with itself); its errors are the
    swarm's."""
    from wispsim.serve.client import SwarmError

    async def make() -> GrpcSessions:  # its channel belongs to the loop that awaits it
        return GrpcSessions(target, SwarmError)

    rpc: GrpcSessions = client.call(make())
    client.closing.append(rpc.aclose)
    return rpc
