"""Token ids -> text for streaming: UTF-8-safe incremental detokenising and stop-string matching.

:class:`IncrementalDetokenizer` never returns half a character: a Bangla letter is 3 UTF-8 bytes
and a byte-level BPE token may end in the middle of one, so text ending in U+FFFD (an incomplete
byte sequence) is held back until the next token completes it (the prefix/read offset scheme
of Hugging Face TGI and vLLM). :class:`StopMatcher` finds stop strings across token boundaries and
holds back any tail that could still become a stop string, so a stop string is never emitted.

    python -c "from prodip.serve.text import StopMatcher; m = StopMatcher(['END']); \
print(m.feed('abcE'), m.feed('NDxyz'))"
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tokenizers import Tokenizer

_REPLACEMENT = "\ufffd"
#: tokens of left context re-decoded with each new token, so decoders that treat the first token
#: specially (e.g. a leading-space strip) see the same context as a full decode (vLLM uses 5).
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas whose concatenation is the full text.

    Args:
        tokenizer: the export's ``tokenizers.Tokenizer``.
        context_ids: ids that precede the generated ones (the prompt's tail), decoded only as
            context so the first generated token is rendered as in ``decode(prompt + generated)``
            minus ``decode(prompt)``; pass ``()`` to decode the generated ids on their own. If the
            prompt ends inside a UTF-8 character, the text starts with that whole character.
    """

    def __init__(self, tokenizer: Tokenizer, context_ids: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # start of the window re-decoded each step
        self._read = 0  # ids before this are already turned into emitted text
        if context_ids:
            self._ids, self._read = _clean_context(self._decode, list(context_ids))

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def add(self, token_id: int) -> str:
        """Append one generated id; return the newly complete text ("" while bytes are incomplete)."""
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        if len(full_text) > len(prefix_text) and not full_text.endswith(_REPLACEMENT):
            new_text = full_text[len(prefix_text) :]
            self._prefix, self._read = self._read, len(self._ids)
            return new_text
        return ""

    def flush(self) -> str:
        """At the end of a sequence: whatever is still held back (may contain U+FFFD if the model
        really produced an invalid byte sequence)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return full_text[len(prefix_text) :]


def _clean_context(decode: Callable[[list[int]], str], ids: list[int]) -> tuple[list[int], int]:
    """Up to :data:`_CONTEXT_TOKENS` prompt-tail ids that decode with no U+FFFD, and where they end.

    Byte-fallback decoders turn a whole run of byte tokens into U+FFFD when any part of it is
    incomplete, so the window must start and end on character boundaries. Ids after the window's
    end (a character the prompt left unfinished) stay unread and come out with the first generated
    token that completes them.

    Returns:
        (window ids + the unread tail, index where the unread part starts).
    """
    for end in range(len(ids), max(0, len(ids) - 8), -1):
        for start in range(max(0, end - _CONTEXT_TOKENS), end):
            text = decode(ids[start:end])
            if text and "\ufffd" not in text:
                return ids[start:], end - start
    return [], 0


class StopMatcher:
    """Cuts generated text at the first occurrence of any stop string, across deltas.

    Args:
        stops: stop strings (non-empty); none means text passes straight through.
    """

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False

    def _hold_len(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:k]):
                    best = k
                    break
        return best

    def feed(self, delta: str) -> str:
        """Add a text delta; return the text safe to emit. Sets ``stopped`` when a stop string is
        found (the returned text then ends right before it and later calls return "")."""
        if self.stopped:
            return ""
        text = self._held + delta
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            return text[: min(hits)]
        hold = self._hold_len(text)
        self._held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]

    def flush(self) -> str:
        """At the end of a sequence that did not hit a stop string: the held-back tail."""
        text, self._held = ("" if self.stopped else self._held), ""
        return text
