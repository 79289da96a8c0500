"""Token ids -> text for streaming: UTF-8-safe incremental detokenising and stop-string matching.

:class:`IncrementalDetokenizer` never returns half a character: a Bangla letter is 3 UTF-8 bytes
and a byte-level BPE token may end in the middle of one, so text ending in U+FFFD (an incomplete
byte sequence) is held back until the next token completes it (the prefix/read offset scheme
of Hugging Face TGI and vLLM). :class:`StopMatcher` finds stop strings across token boundaries, in any Unicode
normalisation form (compared in NFC), and holds back any tail that could still become a stop string,
so a stop string is never emitted.

    python -c "from prodip.serve.text import StopMatcher; m = StopMatcher(['\u09cb']); \
print(repr(m.feed('ab\u09c7')), repr(m.feed('\u09bexyz')), m.stopped)"
"""

from __future__ import annotations

import bisect
import functools
import itertools
import unicodedata
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


@functools.cache
def composition_sets() -> tuple[frozenset[str], frozenset[str]]:
    """(starters a later character can compose with, characters that compose with an earlier one).

    The pairs of the Unicode Character Database's canonical decompositions whose composite NFC
    keeps (primary composites: not a composition exclusion), read from :mod:`unicodedata`, plus
    the Hangul jamo that compose algorithmically (The Unicode Standard section 3.12, conjoining
    jamo: L + V -> LV, LV + T -> LVT). The second set is the characters with NFC_Quick_Check =
    Maybe (UAX #15 section 9). Built once, ~0.07 s (canonical decompositions stop at U+2FA1D): the
    server builds it as it loads, not on the engine thread at its first stop string.
    """
    forward = {chr(c) for c in range(0x1100, 0x1113)}  # Hangul L
    forward |= {chr(c) for c in range(0xAC00, 0xD7A4, 28)}  # Hangul LV syllables
    backward = {chr(c) for c in (*range(0x1161, 0x1176), *range(0x11A8, 0x11C3))}  # Hangul V, T
    for cp in range(0x30000):
        parts = unicodedata.decomposition(chr(cp)).split()
        if len(parts) == 2 and not parts[0].startswith("<"):
            first, second = chr(int(parts[0], 16)), chr(int(parts[1], 16))
            if unicodedata.normalize("NFC", first + second) == chr(cp):
                forward.add(first)
                backward.add(second)
    return frozenset(forward), frozenset(backward)


def _starts_segment(char: str) -> bool:
    """Whether NFC never joins ``char`` to the text before it: the first code point of its
    decomposition is a starter (canonical combining class 0; reordering moves only non-starters)
    that composes with nothing before it. Then ``NFC(a + char + b) == NFC(a) + NFC(char + b)``
    for any ``a`` and ``b`` (ICU's ``hasBoundaryBefore``)."""
    first = unicodedata.normalize("NFD", char)[0]
    return unicodedata.combining(first) == 0 and first not in composition_sets()[1]


def _settled(nfc: str, final: bool) -> int:
    """How much of ``nfc`` (an NFC text) no later text can change: all of it at the end of the
    text (``final``); else up to its last starter, and past it when that starter composes with
    nothing after it and its decomposition ends in a starter. A later character may compose with
    the last starter (``"e"`` + U+0301), and a later combining mark is reordered among the marks
    after it, its own decomposition's included (``"é"`` + U+0323 is ``"ẹ"`` + U+0301)."""
    if final:
        return len(nfc)
    last = next((i for i in range(len(nfc) - 1, -1, -1) if unicodedata.combining(nfc[i]) == 0), -1)
    if last < 0:
        return 0
    char = nfc[last]
    closed = char not in composition_sets()[0] and unicodedata.combining(unicodedata.normalize("NFD", char)[-1]) == 0
    return last + closed


class StopMatcher:
    """Cuts generated text at the first stop string, matched under canonical equivalence, across deltas.

    Why canonical equivalence: one letter has several code point spellings (য় is U+09DF or U+09AF
    U+09BC; ো is U+09CB or U+09C7 U+09BE). A client types either, a byte-level BPE model may write
    either, and a tokenizer without a normaliser (SmolLM2's, Llama 3's, Qwen2's: ``"normalizer":
    null``) does not bring them to one form. So stop strings and text are compared in NFC.
    Why NFC, not NFD: NFC is the form models are trained on and the server speaks (serve/README.md,
    "Text normalisation"), so on NFC text a match is exactly where a plain substring search finds it
    (a stop "e" does not stop inside "é", nor "ে" inside "ো", as they would in NFD). For comparison,
    vLLM's stop checker searches the raw text.

    The returned text is the text as generated (never re-normalised), cut right before the
    characters the match starts in: a match that starts inside one code point (a stop "\\u09bc"
    against U+09DF) cuts before that code point. A match counts once no later text can change it:
    when it ends on a starter that composes with nothing after it (``"\\n"``, ``"."``, a Bangla
    consonant) at once, else when the next character comes (``"e"`` may become ``"é"``), or at the
    end. Text that may still become part of a stop string, or whose NFC may still change, is held
    back, so a stop string is never emitted.

    Args:
        stops: stop strings (non-empty, any normalisation form); none means text passes straight through.
    """

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self.stops = [unicodedata.normalize("NFC", s) for s in stops if s]
        self._longest = max((len(s) for s in self.stops), default=0)
        self._held = ""
        self._starts = [0]  # where the held text's segments start (0 and each _starts_segment character)
        self.stopped = False

    def feed(self, delta: str) -> str:
        """Add a text delta (whole characters); return the text safe to emit. Sets ``stopped`` when a stop
        string is found (the returned text then ends right before it and later calls return "")."""
        return self._advance(delta, final=False)

    def flush(self) -> str:
        """At the end of a sequence: the held-back text, cut before a stop string found in it
        (``stopped`` is then set). "" once stopped."""
        return self._advance("", final=True)

    def _advance(self, delta: str, final: bool) -> str:
        if self.stopped:
            return ""
        text = self._held + delta
        if not self.stops:
            self._held = ""
            return text
        # Segments: NFC(text) is the join of their NFCs, whatever text follows (_starts_segment). Those of
        # the held text are kept: a long run held back (combining marks with no starter) is scanned once.
        starts = self._starts + [i for i in range(max(1, len(self._held)), len(text)) if _starts_segment(text[i])]
        nfcs = [unicodedata.normalize("NFC", text[a:b]) for a, b in zip(starts, starts[1:] + [len(text)])]
        at = list(itertools.accumulate((len(s) for s in nfcs), initial=0))  # NFC offset of each segment
        nfc = "".join(nfcs)
        settled = _settled(nfc, final)
        hits = [i for s in self.stops if 0 <= (i := nfc.find(s)) and i + len(s) <= settled]
        if hits:
            self.stopped, self._held = True, ""
            return text[: _cut(text, starts, at, min(hits))]
        if final:
            self._held = ""
            return text
        # hold from the first settled offset whose settled rest could begin a stop string (the unsettled rest may)
        hold = next(
            h
            for h in range(max(0, settled - self._longest + 1), settled + 1)
            if any(s.startswith(nfc[h:settled]) for s in self.stops)
        )
        if hold == len(nfc):
            keep = len(text)
        else:  # the last segment start at or before it: text after a segment start can still change only there
            keep = starts[bisect.bisect_right(at, hold, hi=len(starts)) - 1]
        self._held = text[keep:]
        self._starts = [i - keep for i in starts if i >= keep] or [0]
        return text[:keep]


def _cut(text: str, starts: list[int], at: list[int], hit: int) -> int:
    """Where in ``text`` a match that starts at NFC offset ``hit`` begins: the last index ``i`` of
    its segment that NFC keeps apart from the rest (``NFC(seg[:i]) + NFC(seg[i:]) == NFC(seg)``)
    and that ends at or before ``hit``. The segment lies in the settled text, so this holds
    whatever comes after."""
    k = bisect.bisect_right(at, hit, hi=len(starts)) - 1
    a, b = starts[k], starts[k + 1] if k + 1 < len(starts) else len(text)
    seg = unicodedata.normalize("NFC", text[a:b])
    for i in range(b, a, -1):
        left = unicodedata.normalize("NFC", text[a:i])
        if at[k] + len(left) <= hit and left + unicodedata.normalize("NFC", text[i:b]) == seg:
            return i
    return a
