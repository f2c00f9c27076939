"""The tokens a chat request generated, read from the next turn of the same chat (`cachemon analyze`,
rule 8 in docs/analyze.md)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from cachemon.analyze.requests_io import Request
from cachemon.analyze.sim.block_hash import BlockKey, Placeholder


class _Turn(NamedTuple):
    """A chat request whose reply the next turn may show."""
    hashes: list[int]               # its prompt's block hashes
    tail: tuple[int, ...]           # its prompt's tokens after the last full block
    prompt_tokens: int
    messages: int
    placeholders: list[Placeholder]   # its generated blocks, until the next turn names them


class ReplyInference:
    """The tokens a chat request generated, read from the next turn of the same chat.

    vLLM caches every full block of computed tokens, generated ones included (rule 8 in
    docs/analyze.md; ``KVCacheManager.allocate_slots`` / ``BlockPool.cache_full_blocks`` in
    vllm/v1/core, 0.32.0), so the next turn of a chat hits the blocks its previous reply
    filled. A request log often has ``usage.completion_tokens`` but not the output ids; the
    next turn's prompt shows the reply. When a chat request's prompt starts with an earlier
    request's whole prompt (same token ids) and its next message is the assistant's, the
    blocks the earlier decode filled -- tokens ``[P, P + completion_tokens - 1)``, the last
    output token is never fed back -- are taken from the later prompt: their hashes are the
    later request's own block hashes at those positions.

    Until then those blocks are placeholders ``("generated", serial, position)``: they take
    room in the pool and never hit; ``step`` returns the renaming to apply to every
    simulation before the later request runs. On the real capture
    (tests/fixtures/vllm-0.32.0-cpu-analyze-v2) the reply as rendered in the next turn equals
    the generated ids token for token; a template that re-renders a reply differently
    (reasoning stripped, whitespace normalised) would make this predict hits vLLM misses."""

    def __init__(self, block_size: int, per_session: int = 8, sessions: int = 4096):
        self.block_size = block_size
        self._pending: dict[str, list[_Turn]] = {}    # session -> its turns, oldest first
        self._per_session = per_session
        self._sessions = sessions
        self._serial = 0
        self.inferred_blocks = 0
        self.dropped = 0                       # pending requests forgotten (memory bound)

    def step(self, req: Request, ids: Sequence[int], hashes: list[int], completion_tokens: int,
             completion_ids: Sequence[int] | None) -> tuple[dict[Placeholder, int] | None, list[BlockKey] | None]:
        """(renaming for the earlier turn's placeholders or None, this request's placeholders
        for its generated blocks or None when its output ids are known / it fills none)."""
        bs = self.block_size
        chat = req.kind == "chat" and req.session is not None and req.messages is not None
        mapping = None
        if chat and self._pending:
            recs = self._pending.get(req.session)   # type: ignore[arg-type]
            if recs:
                mapping = self._match(recs, req, ids, hashes)
        generated: list[BlockKey] | None = None
        if completion_ids is None:
            k0 = len(hashes)
            n_full = (len(ids) + max(completion_tokens - 1, 0)) // bs
            if n_full > k0:
                self._serial += 1
                placeholders = [("generated", self._serial, j) for j in range(k0, n_full)]
                generated = [*placeholders]
                if chat:
                    self._remember(req.session, _Turn(hashes, tuple(ids[k0 * bs:]), len(ids),   # type: ignore[arg-type]
                                                      len(req.messages), placeholders))   # type: ignore[arg-type]
        return mapping, generated

    def _match(self, recs: list[_Turn], req: Request, ids: Sequence[int], hashes: list[int]) -> dict[Placeholder, int] | None:
        bs = self.block_size
        msgs = req.messages or []
        for i in range(len(recs) - 1, -1, -1):
            a_hashes, tail, p, n_msgs, generated = recs[i]
            k0 = len(a_hashes)
            if (len(ids) > p and len(msgs) > n_msgs and msgs[n_msgs].get("role") == "assistant"
                    and hashes[:k0] == a_hashes and tuple(ids[k0 * bs:p]) == tail):
                del recs[i]
                mapping = {ph: hashes[ph[2]] for ph in generated if ph[2] < len(hashes)}
                self.inferred_blocks += len(mapping)
                return mapping
        return None

    def _remember(self, session: str, rec: _Turn) -> None:
        recs = self._pending.pop(session, None) or []
        recs.append(rec)
        if len(recs) > self._per_session:
            self.dropped += 1
            del recs[0]
        self._pending[session] = recs          # most recently used session last
        if len(self._pending) > self._sessions:
            from itertools import islice
            drop = len(self._pending) - self._sessions // 2
            self.dropped += sum(len(v) for v in islice(self._pending.values(), drop))
            self._pending = dict(islice(self._pending.items(), drop, None))
