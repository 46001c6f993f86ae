"""Count the values of a JSON text without building them. Pure (numpy only).

A JSON parser (msgspec, like any other) makes one Python object per value: a one-character string
costs about 60 bytes of memory for its 4 bytes of JSON (``"a",``), a float 32 bytes for ``1.5,``.
The codec (``kubeinfer.runtime.protocol``) counts the values of a request's ``data`` (and of its
``inputs`` list) here first, so that a request whose counts are over its limits is refused before
anything is built for it.

``scan`` reads the text in blocks of ``BLOCK_BYTES`` with numpy (a few vector operations per block,
about 24 bytes of scratch memory per byte of block, whatever the text's size): it finds the quotes
that open and close strings (a quote preceded by an odd number of backslashes is escaped), marks
what lies outside strings, and counts there the brackets, the commas directly inside the outermost
array and the starts of numbers and literals. numpy's vector loops release the GIL, so a scan on a
worker thread leaves the event loop its turns.

The text must be valid JSON (msgspec has checked it: ``msgspec.Raw`` values are checked while they
are skipped); on invalid JSON the counts mean nothing, but the scan still ends, in bounded memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Bytes scanned per block: the scratch memory is about 24 times this (1.5 MB). 64 MB of one-character
#: strings took 0.27 s on the (busy) 2-core development machine, 0.23 s in blocks of 256 KiB.
BLOCK_BYTES = 1 << 16

_QUOTE, _BACKSLASH, _COMMA, _COLON = (ord(c) for c in '"\\,:')
_OPEN, _CLOSE = (ord("["), ord("{")), (ord("]"), ord("}"))


@dataclass(frozen=True)
class Counts:
    """What ``scan`` counted in a JSON text.

    Attributes:
        items: values directly inside the outermost array (0 when the text is no array).
        scalars: strings, numbers, true, false and null at any depth (object keys are strings too).
        containers: arrays and objects, the outermost included.
    """

    items: int
    scalars: int
    containers: int

    @property
    def values(self) -> int:
        """Every value a parser builds for the text: ``scalars + containers``."""
        return self.scalars + self.containers


def scan(text: bytes | bytearray | memoryview) -> Counts:
    """Count the values of the JSON text ``text`` (UTF-8) without parsing it into objects.

    Returns ``Counts``; exact for valid JSON. Memory: a few blocks of ``BLOCK_BYTES``, not the text's
    size. Raises nothing (invalid JSON gives meaningless counts)."""
    data = np.frombuffer(memoryview(text).cast("B"), np.uint8)
    in_string = 0  # 1 while inside a string (its opening quote seen)
    backslashes = 0  # length of the run of backslashes that ended the previous block
    depth = 0  # brackets and braces open outside strings at the end of the previous block
    token_before = False  # the previous block ended inside a number or literal
    commas = quotes = tokens = containers = 0
    for start in range(0, len(data), BLOCK_BYTES):
        block = data[start : start + BLOCK_BYTES]
        quote = block == _QUOTE
        backslash = block == _BACKSLASH
        if backslashes or backslash.any():
            _unescape(quote, backslash, backslashes)
            backslashes = _trailing_run(backslash, backslashes)
        # odd from an opening quote up to (not including) its closing quote
        inside = (np.cumsum(quote, dtype=np.int32) + in_string) & 1
        in_string = int(inside[-1])
        outside = (inside == 0) & ~quote
        quotes += int(np.count_nonzero(quote))
        opens = outside & ((block == _OPEN[0]) | (block == _OPEN[1]))
        closes = outside & ((block == _CLOSE[0]) | (block == _CLOSE[1]))
        containers += int(np.count_nonzero(opens))
        level = np.cumsum(opens.view(np.int8) - closes.view(np.int8), dtype=np.int32) + depth
        depth = int(level[-1])
        commas += int(np.count_nonzero(outside & (block == _COMMA) & (level == 1)))
        # outside strings, every character that is no whitespace (all <= 32 in valid JSON) and no
        # punctuation belongs to a number or to true, false or null
        token = outside & (block > 32) & ~opens & ~closes & (block != _COMMA) & (block != _COLON)
        tokens += int(np.count_nonzero(token[1:] & ~token[:-1])) + int(bool(token[0]) and not token_before)
        token_before = bool(token[-1])
    scalars = quotes // 2 + tokens
    if _first_char(data) != ord("["):
        return Counts(0, scalars, containers)
    nonempty = scalars + containers > 1  # the outermost array holds a value
    return Counts(commas + 1 if nonempty else 0, scalars, containers)


def _unescape(quote: np.ndarray, backslash: np.ndarray, carried: int) -> None:
    """Clear in ``quote`` the quotes that follow an odd run of backslashes (escaped: ``\\"``);
    ``carried`` backslashes ended the previous block. Costs in proportion to the backslashes."""
    where = np.flatnonzero(backslash)
    if not len(where):  # only the carried run, before the first character
        if carried & 1:
            quote[0] = False
        return
    # runs of consecutive backslashes: their first and last positions
    breaks = np.flatnonzero(np.diff(where) != 1)
    firsts = np.concatenate(([where[0]], where[breaks + 1]))
    lasts = np.concatenate((where[breaks], [where[-1]]))
    lengths = lasts - firsts + 1
    if firsts[0] == 0:
        lengths[0] += carried
    elif carried & 1:
        quote[0] = False
    after = lasts + 1
    odd = (lengths & 1).astype(np.bool_) & (after < len(quote))
    quote[after[odd]] = False


def _trailing_run(backslash: np.ndarray, carried: int) -> int:
    """How many backslashes end the block (with the ``carried`` run when the whole block is one)."""
    others = np.flatnonzero(~backslash)
    if not len(others):
        return carried + len(backslash)
    return int(len(backslash) - 1 - others[-1])


def _first_char(data: np.ndarray) -> int:
    """The first character that is no JSON whitespace (-1 for none)."""
    for start in range(0, len(data), BLOCK_BYTES):
        block = data[start : start + BLOCK_BYTES]
        other = np.flatnonzero(block > 32)
        if len(other):
            return int(block[other[0]])
    return -1


def _bytes(text: bytes | bytearray | memoryview) -> np.ndarray:
    return np.frombuffer(memoryview(text).cast("B"), np.uint8)


def first_char(text: bytes | bytearray | memoryview) -> int:
    """The first byte of ``text`` that is no JSON whitespace, as an int (-1 when there is none)."""
    return _first_char(_bytes(text))


def count_byte(text: bytes | bytearray | memoryview, byte: int) -> int:
    """How many times ``byte`` occurs in ``text`` (in blocks: no copy of the text)."""
    data = _bytes(text)
    return sum(
        int(np.count_nonzero(data[start : start + BLOCK_BYTES] == byte))
        for start in range(0, len(data), BLOCK_BYTES)
    )


def upper_bound(text: bytes | bytearray | memoryview) -> int:
    """At least as many as the values a parser builds for the JSON text ``text``: one, plus one per
    comma, colon (an object's key), bracket and brace (a container of k values holds k - 1 commas),
    wherever they are (in strings too). Four byte counts: cheap next to ``scan``."""
    return 1 + sum(count_byte(text, c) for c in (_COMMA, _COLON, _OPEN[0], _OPEN[1]))
