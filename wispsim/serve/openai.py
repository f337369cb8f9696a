"""Any OpenAI-compatible server (``vllm serve``, ...) as the real side of a swarm.

Centralized serving only: the server generates every token, with or without speculation of its
own (policies whose ``server.mode`` is ``centralized``: ``centralized``, ``centralized-sd``). Each
device's response is one streaming ``POST {base}/completions``: ``prompt`` the token ids the
device sends (the ids :class:`~wispsim.serve.swarm.RemoteCentral` makes for ``wispsim serve``),
``max_tokens`` = ``min_tokens`` = the output length, ``ignore_eos``, ``temperature`` 0, and
usage in the stream. Every chunk that brings tokens is recorded with its arrival time.

Tokens per chunk (under speculative decoding one chunk carries every token a step accepted),
first rule that applies: the chunk's cumulative ``usage.completion_tokens`` (vLLM's
``continuous_usage_stats``); else the length of its ``token_ids`` (vLLM's ``return_token_ids``);
else one token per chunk with text, and the final usage chunk's total puts any difference on the
last chunk. A response that ends with another count than was asked is an error.

What an OpenAI server does not say is left out: no batch log, no per-step log, no clock (the
offset is 0; on one host the clocks agree). vLLM's ``/metrics``, when it is there and
``prometheus_client`` is installed, gives the KV block size, the KV capacity and whether the
server speculates; ``owned_by: vllm`` in ``/v1/models`` says its engine core runs in a process
of its own (``vllm serve`` always runs it so).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any
from urllib.parse import urlsplit

from wispsim.config import Scenario
from wispsim.config.schema import POLICIES
from wispsim.serve.client import Client, SwarmError, error_detail
from wispsim.serve.clock import WallClock
from wispsim.serve.swarm import RemoteCentral
from wispsim.sim.generation import Served
from wispsim.sim.serving import serving_of

OPTION = "--openai-url"


def centralized_policies() -> list[str]:
    """The policy presets an OpenAI server can be the real side of (``server.mode`` centralized)."""
    return [name for name, p in POLICIES.items() if p["mode"] == "centralized"]


def check_policy(sc: Scenario, option: str = OPTION) -> None:
    """A one-line error if ``sc``'s policy is not served centrally (an OpenAI server only
    generates whole responses; it cannot verify a device's drafts)."""
    if serving_of(sc).name != "centralized":
        raise SwarmError(
            f"{option}: drives centralized serving only (server.mode centralized: policies "
            f"{', '.join(centralized_policies())}); policy {sc.policy} is speculative"
        )


def api_base(url: str) -> str:
    """The API base as OpenAI clients take it: ``http://host:port/v1``; a URL without a path gets
    ``/v1``. A one-line error for anything that is not an http(s) URL."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SwarmError(f"{OPTION}: {url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)")
    path = parts.path.rstrip("/") or "/v1"
    return f"{parts.scheme}://{parts.netloc}{path}"


def chunk_tokens(chunk: dict[str, Any], so_far: int) -> int:
    """Tokens of the response after ``chunk`` (see the module's rule), ``so_far`` before it."""
    choices = chunk.get("choices") or []
    if not choices:
        return so_far  # the final usage chunk: no new tokens
    usage = chunk.get("usage")
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        return int(usage["completion_tokens"])
    choice = choices[0]
    if isinstance(choice.get("token_ids"), list):
        return so_far + len(choice["token_ids"])
    return so_far + 1 if choice.get("text") else so_far


def metrics_facts(text: str) -> dict[str, Any]:
    """KV block size and capacity, prefix caching, and whether the server speculates, from vLLM's
    Prometheus metrics; nothing when they are not vLLM's or ``prometheus_client`` is missing."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return {}
    facts: dict[str, Any] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.name.startswith("vllm:spec_decode"):
                facts["server_speculation"] = True
            if family.name == "vllm:cache_config_info" and family.samples:
                labels = family.samples[0].labels
                bs, blocks = labels.get("block_size", ""), labels.get("num_gpu_blocks", "")
                if bs.isdigit() and blocks.isdigit():
                    facts |= {"block_size": int(bs), "kv_capacity_tokens": int(bs) * int(blocks)}
                facts["prefix_caching"] = labels.get("enable_prefix_caching") == "True"
    except ValueError:  # not Prometheus text
        return {}
    if facts:
        facts.setdefault("server_speculation", False)
    return facts


class OpenAIServer:
    """An OpenAI-compatible server at ``url`` (its API base, :func:`api_base`): the model it
    serves (``model``: the only one it lists if None), and the vocabulary the devices' token ids
    are drawn from (``vocab``: the scenario's profile's model if None)."""

    source = "an OpenAI-compatible server"
    read_timeout = 120.0  # a stalled server is an error after this long without a line

    def __init__(self, url: str, model: str | None = None, vocab: int | None = None) -> None:
        self.url = api_base(url)
        self.model = model
        self.vocab = vocab

    def connect(self, sc: Scenario, client: Client) -> tuple[dict[str, Any], float]:
        """The server's facts (its clock offset is 0: it reports no clock); one-line errors for a
        speculative policy, an unreachable or non-OpenAI server, a missing model, a scenario
        longer than the model's context, and token ids it refuses (one probe completion)."""
        check_policy(sc)
        listing = client.call(client.request("GET", "/models"))
        data = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(data, list) or not all(isinstance(m, dict) and "id" in m for m in data):
            raise SwarmError(
                f"{self.url}/models: no model list (data: [{{id: ...}}]); not an OpenAI-compatible API"
            )
        ids = [str(m["id"]) for m in data]
        if self.model is None and len(ids) != 1:
            raise SwarmError(
                f"{self.url}/models: serves {len(ids)} models ({', '.join(ids)}); name one: --openai-model"
            )
        model = self.model if self.model is not None else ids[0]
        if model not in ids:
            raise SwarmError(
                f"--openai-model: {model!r} is not served at {self.url} (it serves {', '.join(ids)})"
            )
        entry = data[ids.index(model)]
        vocab = self.vocab if self.vocab is not None else _profile_vocab(sc)
        vllm = entry.get("owned_by") == "vllm"
        facts: dict[str, Any] = {
            "engine": "vllm" if vllm else "openai",
            "api": "openai",
            "url": self.url,
            "model": model,
            "mode": "centralized",
            "policy": sc.policy,
            "vocab": vocab,
            "max_len": entry.get("max_model_len"),
            "engine_in_process": False if vllm else None,  # `vllm serve`: the engine core apart
        }
        longest = int(sc.workload.prompt_tokens.support()[1] + sc.workload.output_tokens.support()[1])
        if isinstance(facts["max_len"], int) and longest > facts["max_len"]:
            raise SwarmError(
                f"{self.url}: model {model} holds {facts['max_len']} tokens (max_model_len), the scenario's "
                f"longest response {longest}; shorten workload.prompt_tokens / output_tokens or raise it"
            )
        facts |= client.call(self._metrics(client))
        client.call(self._probe(client, model, vocab))
        return facts, 0.0

    async def _metrics(self, client: Client) -> dict[str, Any]:
        import httpx

        root = self.url.removesuffix("/v1")
        try:
            r = await client.http.get(f"{root}/metrics")
        except httpx.HTTPError:
            return {}
        return metrics_facts(r.text) if r.status_code == 200 else {}

    async def _probe(self, client: Client, model: str, vocab: int) -> None:
        """One short completion with the highest token id the devices send."""
        body = self.body(model, [min(100, vocab - 1), vocab - 1], 1)
        async for _ in self.stream(client, body):
            pass

    def body(self, model: str, prompt: list[int], output: int) -> dict[str, Any]:
        return {
            "model": model,
            "prompt": prompt,
            "max_tokens": output,
            "min_tokens": output,  # vLLM's: with ignore_eos, exactly `output` tokens
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "return_token_ids": True,
        }

    async def stream(self, client: Client, body: dict[str, Any]) -> Any:
        """The chunks (parsed JSON) of one streamed completion; a one-line error for an HTTP
        error, a broken stream, an error the server sends in the stream, or a line not JSON."""
        import httpx

        where = f"{self.url}/completions"
        try:
            async with client.http.stream("POST", "/completions", json=body) as r:
                if r.status_code >= 400:
                    text = (await r.aread()).decode(errors="replace")
                    raise SwarmError(f"{where}: HTTP {r.status_code}: {_hinted(error_detail(text))}")
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # blank lines, SSE comments and event names
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        raise SwarmError(f"{where}: a streamed line is not JSON: {data[:80]!r}") from None
                    if not isinstance(chunk, dict):
                        raise SwarmError(f"{where}: a streamed line is not a JSON object: {data[:80]!r}")
                    if "error" in chunk:
                        raise SwarmError(
                            f"{where}: the server failed mid-stream: {_hinted(error_detail(data))}"
                        )
                    yield chunk
        except httpx.HTTPError as e:
            raise SwarmError(f"{where}: {type(e).__name__}: {e or 'no answer'}") from None

    def remote(
        self, sc: Scenario, env: WallClock, client: Client, offset: float, facts: dict[str, Any], seed: int
    ) -> OpenAICentral:
        return OpenAICentral(env, client, offset, int(facts["vocab"]), seed, self, str(facts["model"]))

    def log(self, client: Client) -> dict[str, Any]:
        return {"batches": [], "members": []}  # an OpenAI server keeps no batch log


class OpenAICentral(RemoteCentral):
    """``ctx.server`` for centralized devices: each response is one streamed completion of the OpenAI
    server; every chunk's arrival is recorded (``arrivals``: response, tokens so far, local time,
    NaN for the server's time, which it does not report)."""

    def __init__(
        self,
        env: WallClock,
        client: Client,
        offset: float,
        vocab: int,
        seed: int,
        server: OpenAIServer,
        model: str,
    ) -> None:
        super().__init__(env, client, offset, vocab, seed)
        self.server = server
        self.model = model

    async def _generate(self, rid: int, prompt: int, output: int, done: Any) -> None:
        body = self.server.body(self.model, self.tokens(0, rid, prompt), output)
        first = math.nan  # when the chunk with the first token arrived
        count, total, rows = 0, None, []
        try:
            async for chunk in self.server.stream(self.client, body):
                now = time.monotonic() - self.env.origin
                new = chunk_tokens(chunk, count)
                if new > count:
                    first = now if math.isnan(first) else first
                    count = new
                    rows.append((rid, count, now, math.nan))
                usage = chunk.get("usage")
                if not chunk.get("choices") and isinstance(usage, dict):
                    total = usage.get("completion_tokens")
            if isinstance(total, int) and total > count and rows:  # chunks without counts
                rows[-1] = (rid, total, rows[-1][2], math.nan)
                count = total
            if count != output:
                raise SwarmError(
                    f"{self.server.url}/completions: {count} tokens came back for a response of {output} "
                    "(does the server honour ignore_eos / min_tokens?)"
                )
        except BaseException as e:
            self.fail(e)
            return
        finally:
            self.arrivals.extend(rows)
        # the chunks the tokens came in (the responses' ``rounds``, as the simulator counts steps)
        self.settle(done, Served(first, len(rows)), time.monotonic() - self.env.origin)


def _hinted(detail: str) -> str:
    """A server's error, with the option to change when it refuses the token ids sent."""
    return f"{detail} (--openai-vocab bounds the token ids sent)" if "vocab" in detail else detail


def _profile_vocab(sc: Scenario) -> int:
    from wispsim.model.profiles import load_profile

    return int(load_profile(sc.server.profile).model.vocab_size)
