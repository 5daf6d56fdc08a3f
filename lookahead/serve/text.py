"""A row's text as it grows: incremental detokenization, stop strings, and what may be streamed so far."""
from __future__ import annotations


class TextOut:
    """The text of a row's new tokens, cut at the first stop string.

    `update(tokens)` decodes the tokens so far and returns the text that may be sent now: never a character that
    could still turn out to be part of a stop string, nor an incomplete UTF-8 sequence (decoded as U+FFFD).

    Args:
        tokenizer: decodes the row's tokens (special tokens skipped).
        stops: the request's stop strings.
    """

    def __init__(self, tokenizer, stops: tuple = ()):
        self.tokenizer, self.stops = tokenizer, tuple(s for s in stops if s)
        self.hold = max(map(len, self.stops), default=1) - 1  # characters that could start a stop string
        self.text, self.sent, self.stopped = "", 0, False

    def update(self, tokens: list, final: bool = False) -> str:
        """The new text that may be sent after `tokens` (all of the row's new tokens); `final`: the row is done,
        send everything left. Sets `stopped` when a stop string appeared (the text ends before it)."""
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        cut = self._stop_at(text)
        if cut is not None:
            text, self.stopped, final = text[:cut], True, True
        self.text = text
        end = len(text) if final else len(text) - self.hold
        if not final:
            while end > self.sent and text[end - 1] == "\ufffd":  # a character whose bytes are not all there
                end -= 1
        if end <= self.sent:
            return ""
        new, self.sent = text[self.sent:end], end
        return new

    def _stop_at(self, text: str) -> int | None:
        """Where the first stop string begins in `text`, looking only where a new one can be."""
        start = max(self.sent - self.hold, 0)
        found = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        return min(found) if found else None
