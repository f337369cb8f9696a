"""A session-resident verifier on vLLM (``server.verifier.kind: resident``; issue 36).

A stock server verifies a round by re-submitting the session's whole sequence as a new request:
vLLM hashes it, looks its blocks up in the prefix cache and forwards the tail after the last
whole block again. The paper's verification engine keeps each session in the engine instead.
vLLM 0.32 can: a *resumable* request (its streaming-input sessions) stays in the scheduler
after each chunk, waiting for the next one with its KV blocks held
(``WAITING_FOR_STREAMING_REQ``). Appending is all a session update does, so the rejected drafts of
the last round would stay in the sequence; :func:`rollback` drops them first, the way the
speculative-decoding path forgets rejected tokens: it cuts the request's computed tokens, its
token lists and block hashes back to the committed sequence. Blocks are shared between requests
through the prefix cache, so the blocks past the committed point leave the request (another
holder keeps reading them unchanged) and the block the committed point falls in is written again
only where the session holds it alone; where another request holds it, the session writes into a
copy (copy on write). An earlier version kept writing into such a shared block, so one session's
ordinary round changed the KV another session verified against (issue 42);
``tests/engines/test_vllm_resident.py`` checks every round against a fresh request on a model whose
next token depends on its whole context, with sessions that share prompts and drafts.

A round then sends what the engine has not computed of the committed sequence (the last round's
bonus token, and nothing else while the session keeps up) and the new drafts, one output token.

Everything here edits the engine core's state between steps, so it needs the engine core in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as ``release_prefixes`` does) and is called only
from the server's batch thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from wispsim.engines.vllm_steps import EngineStalled, drive, in_process_core
from wispsim.errors import WispsimError


def rollback(core: Any, rid: str, keep: int) -> int:
    """Cut a paused resident request back to its first ``keep`` tokens; returns how many tokens
    the engine still holds of them (``keep``, or the last block boundary before it where the
    block there had to be given up), the rest to be sent again.

    No block that another request can read is ever written again (issue 42): blocks wholly past
    ``keep`` leave the request (another request still holding one keeps it, and a cached one stays
    cached, its content still what its hash says); the block holding ``keep`` is the request's to
    write past ``keep`` only if nobody else holds it -- then its prefix-cache entry goes, since its
    content will change -- and is copied first where another request holds it (copy on write:
    vLLM's own partial-hit copy, run by the worker before the next step), or given up and its
    tokens recomputed where no block is free for the copy."""
    sched = core.scheduler
    req = sched.requests[rid]
    # In one process the model runner holds the very list the scheduler extends (no message
    # between them copies it), and vLLM 0.32's session update would extend it twice: copy it.
    req.prompt_token_ids = list(req.prompt_token_ids)
    if keep >= req.num_computed_tokens:
        return int(req.num_computed_tokens)
    mgr = sched.kv_cache_manager
    pool = mgr.block_pool
    size = int(sched.cache_config.block_size)
    full, part = divmod(keep, size)
    kept = full + (1 if part else 0)  # blocks that hold the first `keep` tokens
    singles = mgr.coordinator.single_type_managers
    if part and any(_shared(s, rid, full) for s in singles) and not _can_copy(pool, singles):
        keep, part, kept = full * size, 0, full  # no block for the copy: recompute that block's tokens
    for single in singles:
        blocks = single.req_to_blocks.get(rid)
        if blocks is None:
            continue
        tail = blocks[kept:]
        del blocks[kept:]
        pool.free_blocks(reversed(tail))  # our reference only; others' and the cache entries stay
        if part and len(blocks) == kept:
            b = blocks[full]
            if b.ref_cnt > 1:  # another request reads it: write into a private copy
                copy = pool.get_new_blocks(1)[0]
                single._apply_cow(rid, full, b, copy)
            else:  # ours alone: its tokens past `keep` change, so its cache entry must go
                pool._maybe_evict_cached_block(b)
        if single.num_cached_block.get(rid, 0) > full:
            single.num_cached_block[rid] = full
    req.num_computed_tokens = keep
    del req._all_token_ids[keep:]
    del req.prompt_token_ids[keep:]
    req.num_prompt_tokens = len(req.prompt_token_ids)
    del req.block_hashes[keep // int(getattr(sched, "hash_block_size", size)) :]
    return keep


def _shared(single: Any, rid: str, index: int) -> bool:
    blocks = single.req_to_blocks.get(rid, [])
    return index < len(blocks) and blocks[index].ref_cnt > 1


def _can_copy(pool: Any, singles: list[Any]) -> bool:
    """A free block for each manager's copy, and vLLM's copy-on-write hook to run it."""
    return pool.get_num_free_blocks() >= len(singles) and all(hasattr(s, "_apply_cow") for s in singles)


@dataclass
class _Resident:
    internal: str  # the request's id inside the engine
    tokens: list[int] = field(default_factory=list)  # what the engine holds: computed, or sent
    used: int = 0  # when it last ran (a round counter), for least-recently-used eviction


class ResidentSessions:
    """Verification sessions kept in a vLLM engine (module docstring); ``llm`` is a
    ``vllm.LLM`` whose engine core runs in this process.

    The engine is driven with a progress check (:func:`wispsim.engines.vllm_steps.drive`): when a
    round cannot be scheduled, the least recently used idle session is ended to make room (the
    server keeps its tokens, so its next round re-opens it, cold; counted in ``evictions``), and
    when no idle session is left the rounds still unserved get no token (None) and their sessions
    are ended in the engine, so nothing waits forever. ``stop`` (set at shutdown) ends a batch
    between engine steps."""

    def __init__(self, llm: Any, params: Any, stop: threading.Event | None = None) -> None:
        engine = llm.llm_engine
        core = in_process_core(engine)
        if core is None:
            raise WispsimError(
                "server.verifier.kind: resident keeps sessions in vLLM's engine core, which must run in the "
                "server's process: unset VLLM_ENABLE_V1_MULTIPROCESSING or set it to 0"
            )
        self.engine = engine
        self.core = core
        self.params = params
        self.stop = stop
        self.tasks = engine.get_supported_tasks()
        self.sessions: dict[int, _Resident] = {}
        self.evictions = 0  # idle sessions ended to make room
        self.stalls = 0  # rounds the engine could not serve
        self.outputs: dict[str, Any] = {}
        self._clock = 0

    def _add(self, sid: int, ids: list[int]) -> None:
        """Add a chunk to session ``sid`` the way ``AsyncLLM`` adds a streaming-input chunk."""
        from vllm.inputs import TokensPrompt

        s = self.sessions.get(sid)
        ext = external_id(sid)
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

    def run(self, items: list[tuple[int, list[int], list[int]]]) -> tuple[list[int | None], tuple[int, ...]]:
        """One round for each ``(session, committed tokens, drafts)``: roll the session back to
        the longest start it shares with its committed tokens, send the rest and the drafts, and
        step the engine until each has its next token. Returns the tokens (None for a round the
        engine could not serve: its session was ended, nothing of the round kept) and, per
        round, how many of its tokens the engine already held (the rest it forwards)."""
        self._clock += 1
        held = []
        for sid, committed, draft in items:
            s = self.sessions.get(sid)
            keep = 0
            if s is not None:
                have = s.tokens
                n = min(len(have), len(committed))
                while keep < n and have[keep] == committed[keep]:
                    keep += 1
                keep = rollback(self.core, s.internal, keep)
            self._add(sid, committed[keep:] + draft)
            s = self.sessions[sid]
            s.tokens = committed + draft
            s.used = self._clock
            held.append(keep)
        want = {external_id(sid) for sid, _, _ in items}
        try:
            got = drive(
                self.engine, want, _answered, stop=self.stop, make_room=lambda: self._evict_idle(want)
            )
        except EngineStalled as e:
            got = e.got
            lost = [sid for sid, _, _ in items if external_id(sid) in e.missing]
            self.stalls += len(lost)
            self.end(lost)
        self.outputs = got  # vLLM's outputs of the last batch, by external id (tests read logprobs)
        bonus = [_token(got.get(external_id(sid))) for sid, _, _ in items]
        return bonus, tuple(held)

    def _evict_idle(self, busy: set[str]) -> bool:
        """End the least recently used session not in ``busy`` (external ids): False if none."""
        idle = [(s.used, sid) for sid, s in self.sessions.items() if external_id(sid) not in busy]
        if not idle:
            return False
        self.end([min(idle)[1]])
        self.evictions += 1
        return True

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


def external_id(sid: int) -> str:
    return f"wispsim-session-{sid}"


def _answered(o: Any) -> bool:
    return bool(o.outputs and o.outputs[0].token_ids)


def _token(o: Any) -> int | None:
    return None if o is None else int(o.outputs[0].token_ids[-1])
