"""The verifier's build (``server.build``, issue 46): how a speculative server is built, named.

A capacity answer depends on three facts that no policy names: how a round reaches the engine
(``server.verifier.kind``), how the prefix cache reuses a session's prefix
(``server.engine.prefix_reuse``) and how devices talk to the server (``server.host.transport``). A
build is a preset of the three:

``stock-vllm``
    vLLM's OpenAI server as shipped (``vllm serve``): every round is a new ``/v1/completions``
    request carrying the session's whole sequence over HTTP, and vLLM's prefix cache reuses whole
    KV blocks of it (``resubmit``, ``block``, ``http``). What a deployment gets without building a
    session-aware verifier.
``vllm-sessions``
    Sessions kept resident in vLLM's engine behind an HTTP session API (``wispsim serve``'s
    ``/sessions``): a round sends its draft only and the session's KV is reused token by token
    (``resident``, ``token``, ``http``).
``wisp-grpc``
    The WISP paper's verifier: resident sessions, token-granular reuse, devices speaking gRPC
    (``resident``, ``token``, ``grpc``; ``wispsim serve --grpc-port``).
``custom``
    The three fields as the scenario gives them.
``auto`` (the default)
    The policy's own (:data:`POLICY_BUILDS`): ``wisp-grpc`` for the policies that admit by KV
    reservation (``wisp``, ``fcfs``, ``wisp-fixed``: the paper's system), ``stock-vllm`` for the
    LRU ones (``wisp-lru``, ``sled``: a prefix that may be evicted cannot stay resident); a policy
    without one (``custom``, centralized serving, which reads none of the three) keeps the fields
    as given. ``Scenario.with_policy`` sets them again for another policy, so each policy of a
    comparison runs on its own build; written out, an ``auto`` scenario leaves the three fields
    out for the same reason.

Where the scenario names no build but gives any of the three fields, those win and the rest are
the stock server's (``--set server.verifier.kind=resident`` is ``vllm-sessions``); a build the
scenario names sets all three, and an explicit field that disagrees with it is an error naming
where it was given, never a setting silently dropped. Either way the resolved scenario names the
build its fields make (:func:`build_name`; ``custom`` where they match none).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from wispsim.errors import ConfigError

FIELDS = (("verifier", "kind"), ("engine", "prefix_reuse"), ("host", "transport"))
BUILDS: dict[str, tuple[str, str, str]] = {
    "stock-vllm": ("resubmit", "block", "http"),
    "vllm-sessions": ("resident", "token", "http"),
    "wisp-grpc": ("resident", "token", "grpc"),
}
BUILD_NAMES = ("auto", *BUILDS, "custom")
DEFAULT_BUILD = "stock-vllm"  # the fields a scenario does not give, where it names no build
# ``auto``: the policy's own build (the WISP paper's verifier for the policies that admit by KV
# reservation, a stock server for the LRU ones: an evictable prefix cannot stay resident)
POLICY_BUILDS = {
    "wisp": "wisp-grpc",
    "fcfs": "wisp-grpc",
    "wisp-fixed": "wisp-grpc",
    "wisp-lru": "stock-vllm",
    "sled": "stock-vllm",
}


def policy_build(policy: str) -> str | None:
    """The build ``auto`` means under ``policy``; None for a policy without one (``custom``, whose
    scenario chooses the fields itself; centralized serving, which reads none of them)."""
    return POLICY_BUILDS.get(policy)


def with_build(server: Any, build: str | None) -> Any:
    """``server`` (a ServerConfig) with the three fields of ``build`` (a named build; None: the
    fields' own defaults, as a scenario that gives none of them has them)."""
    if build is not None:
        return _with_fields(server, BUILDS[build])
    groups = {"verifier": server.verifier, "engine": server.engine, "host": server.host}
    return _with_fields(server, tuple(type(groups[g]).__dataclass_fields__[n].default for g, n in FIELDS))


def _with_fields(server: Any, values: tuple[str, str, str]) -> Any:
    """``server`` with the three fields (:data:`FIELDS`) set to ``values``."""
    groups = {"verifier": server.verifier, "engine": server.engine, "host": server.host}
    for (group, name), value in zip(FIELDS, values, strict=True):
        groups[group] = dataclasses.replace(groups[group], **{name: value})
    return dataclasses.replace(server, **groups)


def effective_build(server: Any, policy: str) -> str:
    """The build a server runs: ``auto`` resolved by the policy (else named by its fields), a
    named build as it is."""
    if server.build != "auto":
        return str(server.build)
    return policy_build(policy) or build_name(
        server.verifier.kind, server.engine.prefix_reuse, server.host.transport
    )


def build_name(kind: str, prefix_reuse: str, transport: str) -> str:
    """The build three field values make (``custom`` where none). A resident session reuses its
    KV token by token whatever ``prefix_reuse`` says (that field is the re-submitted rounds')."""
    reuse = "token" if kind == "resident" else prefix_reuse
    for name, values in BUILDS.items():
        if values == (kind, reuse, transport):
            return name
    return "custom"


def _value(layers: tuple[tuple[Mapping[str, Any], str], ...], group: str, name: str) -> Any:
    """What the latest layer that gives ``server.<group>.<name>`` says it is."""
    for layer, _ in layers:
        if _given(layer, group, name):
            return layer["server"][group][name]
    return None


def _given(layer: Mapping[str, Any], group: str, name: str) -> bool:
    """Whether ``layer`` sets ``server.<group>.<name>`` (``server.<name>`` with no group)."""
    node = layer.get("server")
    if group:
        node = node.get(group) if isinstance(node, Mapping) else None
    return isinstance(node, Mapping) and name in node


def apply_build(scenario: Any, layers: tuple[tuple[Mapping[str, Any], str], ...]) -> Any:
    """``scenario`` with its build applied (module text); ``layers``: the mappings the scenario was
    written from and where each was given (latest first), to tell explicit fields from defaults
    and to blame a conflict on its source. ``auto`` with none of the three fields given stays
    ``auto``, its fields the policy's build's (``Scenario.with_policy`` sets them again for another
    policy); otherwise ``server.build`` is the name of the build the fields make."""
    srv = scenario.server
    named = next((w for layer, w in layers if _given(layer, "", "build")), None)
    given = {f: next((w for layer, w in layers if _given(layer, *f)), None) for f in FIELDS}
    if srv.build == "auto" and not any(given.values()):
        own = policy_build(scenario.policy)
        return scenario.replace(server=with_build(srv, own)) if own else scenario
    # what was given explicitly stands (a policy preset may have set the fields already, under auto)
    have = {f: _value(layers, *f) if given[f] else getattr(getattr(srv, f[0]), f[1]) for f in FIELDS}
    build = DEFAULT_BUILD if srv.build == "auto" else srv.build
    explicit = srv.build != "auto"
    values = BUILDS.get(build)
    resident = values is not None and values[0] == "resident"
    if resident and explicit and srv.mode == "speculative" and srv.verifier.kv_policy != "admission":
        raise ConfigError(
            named or "scenario",
            "server.build",
            f"{build} keeps each session resident, its KV pinned until the response ends: "
            f"it needs verifier.kv_policy admission, and policy {scenario.policy} evicts LRU; "
            "allowed with this policy: stock-vllm, custom",
        )
    for f, want in zip(FIELDS, values or (), strict=False):
        if given[f] is None:
            have[f] = want
        elif explicit and have[f] != want and not (resident and f[1] == "prefix_reuse"):
            raise ConfigError(
                given[f],
                f"server.{f[0]}.{f[1]}",
                f"{have[f]} conflicts with server.build {build}, which sets {want}; "
                "set server.build: custom to choose it yourself",
            )
    kind, reuse, transport = (have[f] for f in FIELDS)
    if srv.mode == "speculative" and kind == "resubmit" and transport == "grpc":
        raise ConfigError(
            given[("host", "transport")] or named or "scenario",
            "server.host.transport",
            "grpc is measured for resident rounds (benchmarks/vllm/transport_cost.py), not for a round "
            "re-submitting its whole sequence; use verifier.kind resident (server.build wisp-grpc) or "
            "transport http",
        )
    name = build_name(kind, reuse, transport)
    # a named build with its own values (a resident session's prefix_reuse: token)
    server = _with_fields(dataclasses.replace(srv, build=name), BUILDS.get(name, (kind, reuse, transport)))
    return scenario.replace(server=server) if server != srv else scenario
