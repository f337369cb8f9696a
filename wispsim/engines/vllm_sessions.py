"""A session-resident verifier on vLLM (``server.verifier: resident``; issue 36).

A stock server verifies a round by re-submitting the session's whole sequence as a new request:
vLLM hashes it, looks its blocks up in the prefix cache and forwards the tail after the last
whole block again. The paper's verification engine keeps each session in the engine instead.
vLLM 0.32 can: a *resumable* request (its streaming-input sessions) stays in the scheduler
after each chunk, waiting for the next one with its KV blocks held
(``WAITING_FOR_STREAMING_REQ``). Appending is all a session update does, so the rejected drafts of
the last round would stay in the sequence; :func:`rollback` drops them first, the way the
speculative-decoding path forgets rejected tokens: it cuts the request's computed tokens, its
token lists and block hashes back to the committed sequence and drops the prefix-cache entries of
the blocks past it (their slots will be overwritten). ``benchmarks/vllm/round_cost.py`` checked
the result: after every rollback the next token equals a fresh request's over the same tokens.

A round then sends what the engine has not computed of the committed sequence (the last round's
bonus token, and nothing else while the session keeps up) and the new drafts, one output token.

Everything here edits the engine core's state between steps, so it needs the engine core in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as ``release_prefixes`` does) and is called only
from the server's batch thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wispsim.errors import WispsimError


def rollback(core: Any, rid: str, keep: int) -> None:
    """Drop a paused resident request's tokens past ``keep``: the KV of the first ``keep`` tokens
    stays, blocks past it lose their prefix-cache entries."""
    sched = core.scheduler
    req = sched.requests[rid]
    # In one process the model runner holds the very list the scheduler extends (no message
    # between them copies it), and vLLM 0.32's session update would extend it twice: copy it.
    req.prompt_token_ids = list(req.prompt_token_ids)
    if keep >= req.num_computed_tokens:
        return
    full = keep // int(sched.cache_config.block_size)
    req.num_computed_tokens = keep
    del req._all_token_ids[keep:]
    del req.prompt_token_ids[keep:]
    req.num_prompt_tokens = len(req.prompt_token_ids)
    del req.block_hashes[full:]
    mgr = sched.kv_cache_manager
    pool = mgr.block_pool
    for single in mgr.coordinator.single_type_managers:
        for b in single.req_to_blocks.get(rid, [])[full:]:
            pool._maybe_evict_cached_block(b)
        if single.num_cached_block.get(rid, 0) > full:
            single.num_cached_block[rid] = full


@dataclass
class _Resident:
    internal: str  # the request's id inside the engine
    tokens: list[int] = field(default_factory=list)  # what the engine holds: computed, or sent


class ResidentSessions:
    """Verification sessions kept in a vLLM engine (module docstring); ``llm`` is a
    ``vllm.LLM`` whose engine core runs in this process."""

    def __init__(self, llm: Any, params: Any) -> None:
        engine = llm.llm_engine
        core = getattr(getattr(engine, "engine_core", None), "engine_core", None)
        if core is None:
            raise WispsimError(
                "server.verifier: resident keeps sessions in vLLM's engine core, which must run in the "
                "server's process: unset VLLM_ENABLE_V1_MULTIPROCESSING or set it to 0"
            )
        self.engine = engine
        self.core = core
        self.params = params
        self.tasks = engine.get_supported_tasks()
        self.sessions: dict[int, _Resident] = {}

    def _add(self, sid: int, ids: list[int]) -> None:
        """Add a chunk to session ``sid`` the way ``AsyncLLM`` adds a streaming-input chunk."""
        from vllm.inputs import TokensPrompt

        s = self.sessions.get(sid)
        ext = f"wispsim-session-{sid}"
        req = self.engine.input_processor.process_inputs(
            s.internal if s is not None else ext,
            TokensPrompt(prompt_token_ids=ids),
            self.params,
            supported_tasks=self.tasks,
            resumable=True,
        )
        if s is None:
            self.engine.input_processor.assign_request_id(req)
            self.sessions[sid] = _Resident(req.request_id)
        req.external_req_id = ext
        self.engine.output_processor.add_request(req, None, None, 0)
        self.engine.engine_core.add_request(req)

    def run(self, items: list[tuple[int, list[int], list[int]]]) -> tuple[list[int], tuple[int, ...]]:
        """One round for each ``(session, committed tokens, drafts)``: roll the session back to
        the longest start it shares with its committed tokens, send the rest and the drafts, and
        step the engine until each has its next token. Returns the tokens and, per round, how
        many of its tokens the engine already held (the rest it forwards)."""
        held = []
        for sid, committed, draft in items:
            s = self.sessions.get(sid)
            keep = 0
            if s is not None:
                have = s.tokens
                n = min(len(have), len(committed))
                while keep < n and have[keep] == committed[keep]:
                    keep += 1
                rollback(self.core, s.internal, keep)
            send = committed[keep:] + draft
            self._add(sid, send)
            self.sessions[sid].tokens = committed + draft
            held.append(keep)
        want = {f"wispsim-session-{sid}" for sid, _, _ in items}
        got: dict[str, int] = {}
        while not want <= got.keys():
            for o in self.engine.step():
                if o.request_id in want and o.outputs and o.outputs[0].token_ids:
                    got[o.request_id] = int(o.outputs[0].token_ids[-1])
        return [got[f"wispsim-session-{sid}"] for sid, _, _ in items], tuple(held)

    def end(self, sids: list[int]) -> None:
        """End these sessions: their requests finish and their blocks are freed."""
        from vllm.v1.request import RequestStatus

        ids = [self.sessions.pop(sid).internal for sid in sids if sid in self.sessions]
        if ids:
            self.core.scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)
            self.engine.output_processor.abort_requests(ids, internal=True)

    def clear(self) -> None:
        """End every session (a reset between validation points)."""
        self.end(list(self.sessions))
