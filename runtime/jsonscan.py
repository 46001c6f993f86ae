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

``data_spans`` finds, the same way, where each input's ``data`` lies in an infer request, so that the
codec parses the request without them (a JSON parser holds the interpreter while it reads even what it
skips: about 90 ms for 64 MB of numbers) and each ``data`` only once it is counted.

The text must be valid JSON (msgspec has checked it: ``msgspec.Raw`` values are checked while they
are skipped); on invalid JSON the counts mean nothing, but the scan still ends, in bounded memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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


@dataclass(frozen=True)
class _Block:
    """One block of the text as ``_blocks`` reads it: where it starts, its bytes, and per byte whether
    it is an unescaped quote, outside strings, an opening or closing bracket or brace outside strings,
    and ``level``: the brackets and braces open after it."""

    start: int
    block: np.ndarray
    quote: np.ndarray
    outside: np.ndarray
    opens: np.ndarray
    closes: np.ndarray
    level: np.ndarray


def _blocks(data: np.ndarray) -> Iterator[_Block]:
    """The text in blocks of ``BLOCK_BYTES``, the string and nesting state carried from block to block."""
    in_string = 0  # 1 while inside a string (its opening quote seen)
    backslashes = 0  # length of the run of backslashes that ended the previous block
    depth = 0  # brackets and braces open outside strings at the end of the previous block
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
        opens = outside & ((block == _OPEN[0]) | (block == _OPEN[1]))
        closes = outside & ((block == _CLOSE[0]) | (block == _CLOSE[1]))
        level = np.cumsum(opens.view(np.int8) - closes.view(np.int8), dtype=np.int32) + depth
        depth = int(level[-1])
        yield _Block(start, block, quote, outside, opens, closes, level)


def scan(text: bytes | bytearray | memoryview) -> Counts:
    """Count the values of the JSON text ``text`` (UTF-8) without parsing it into objects.

    Returns ``Counts``; exact for valid JSON. Memory: a few blocks of ``BLOCK_BYTES``, not the text's
    size. Raises nothing (invalid JSON gives meaningless counts)."""
    data = _bytes(text)
    token_before = False  # the previous block ended inside a number or literal
    commas = quotes = tokens = containers = 0
    for b in _blocks(data):
        block, outside, opens, closes = b.block, b.outside, b.opens, b.closes
        quotes += int(np.count_nonzero(b.quote))
        containers += int(np.count_nonzero(opens))
        commas += int(np.count_nonzero(outside & (block == _COMMA) & (b.level == 1)))
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


#: Most punctuation marks (outside the inputs' ``data``) ``data_spans`` keeps before it gives up.
MAX_OUTLINE_MARKS = 1 << 15
#: Nesting of an input's object: the body's object (1), ``inputs`` (2), the input (3).
_INPUT_DEPTH = 3


def data_spans(text: bytes | bytearray | memoryview) -> list[tuple[int, int] | None] | None:
    """Where each input's ``data`` lies in an infer request's JSON text, found without parsing it.

    For a text of the shape ``{..., "inputs": [{..., "data": VALUE, ...}, ...], ...}``: one entry per
    object of ``inputs``, in order: the ``(start, end)`` byte offsets of its ``data`` VALUE (whitespace
    trimmed), or None for an input without ``data``. The quotes, commas, colons, brackets and braces
    outside strings and outside the inputs' values are found with numpy in blocks (the GIL released, as
    ``scan``); only those, a few per input, are read one by one. A request parser can then parse the
    text without its ``data`` (cheap: a 64 MB list of numbers takes a JSON parser about 90 ms of CPU
    during which no other thread of the process runs) and each ``data`` only once it is counted.

    Returns None when the text is not clearly of that shape (not an object, ``inputs`` not a list of
    objects, a key written with escapes, ``inputs`` or an input's ``data`` given twice, more than
    ``MAX_OUTLINE_MARKS`` marks to read, unbalanced): the caller then parses the text whole, which
    gives the right answer or error. The VALUEs themselves are not checked: a parser must still read
    each. Raises nothing."""
    data = _bytes(text)
    positions: list[np.ndarray] = []
    kept = 0
    for b in _blocks(data):
        lowest = int(b.level.min())
        if lowest > _INPUT_DEPTH + 1 or (lowest == _INPUT_DEPTH + 1 and not b.opens.any()):
            continue  # all of the block lies inside an input's value (a list of numbers, mostly)
        # the depth before each mark: an opening mark counts itself in ``level``
        punctuation = b.outside & ((b.block == _COMMA) | (b.block == _COLON))
        keep = (b.quote | b.opens | b.closes | punctuation) & ((b.level - b.opens) <= _INPUT_DEPTH)
        where = np.flatnonzero(keep)
        kept += len(where)
        if kept > MAX_OUTLINE_MARKS:
            return None
        positions.append(where + b.start)
    if not positions:
        return None
    where = np.concatenate(positions)
    return _Outline(data, where.tolist()).spans()


class _Outline:
    """Reads an infer request's outline from its marks (see ``data_spans``): a small recursive descent
    over the marks of depth 3 and less. Every method returns None (through ``_Unclear``) on anything it
    does not expect."""

    def __init__(self, data: np.ndarray, marks: list[int]) -> None:
        self.data = data
        self.marks = marks
        self.i = 0

    def spans(self) -> list[tuple[int, int] | None] | None:
        try:
            spans = self._request()
        except _Unclear:
            return None
        return spans if self.i == len(self.marks) else None

    def _char(self) -> int:
        if self.i >= len(self.marks):
            raise _Unclear
        return int(self.data[self.marks[self.i]])

    def _take(self, char: int) -> int:
        if self._char() != char:
            raise _Unclear
        self.i += 1
        return self.marks[self.i - 1]

    def _members(self, on_value: Callable[[bytes, int], None]) -> None:
        """An object's members from its ``{`` to its ``}``: ``on_value(key, colon's offset)`` reads each
        value (and leaves ``self.i`` on the ``,`` or ``}`` after it)."""
        self._take(_OPEN[1])
        if self._char() == _CLOSE[1]:
            self.i += 1
            return
        while True:
            first = self._take(_QUOTE)
            last = self._take(_QUOTE)
            key = bytes(self.data[first + 1 : last])
            if b"\\" in key:
                raise _Unclear
            colon = self._take(_COLON)
            on_value(key, colon)
            if self._char() == _CLOSE[1]:
                self.i += 1
                return
            self._take(_COMMA)

    def _skip_value(self) -> None:
        """Past a value whose inner marks were kept (at this depth): up to the ``,`` or the closing mark
        of the container holding it."""
        depth = 0
        while True:
            char = self._char()
            if depth == 0 and char in (_COMMA, *_CLOSE):
                return
            if char in _OPEN:
                depth += 1
            elif char in _CLOSE:
                depth -= 1
            self.i += 1

    def _request(self) -> list[tuple[int, int] | None]:
        spans: list[list[tuple[int, int] | None]] = []

        def member(key: bytes, _colon: int) -> None:
            if key != b"inputs":
                self._skip_value()
                return
            if spans:
                raise _Unclear
            spans.append(self._inputs())

        self._members(member)
        if not spans:
            raise _Unclear
        return spans[0]

    def _inputs(self) -> list[tuple[int, int] | None]:
        start = self._take(_OPEN[0])
        spans: list[tuple[int, int] | None] = []
        if self._char() == _CLOSE[0]:  # empty, or values that hold no mark (``[5]``)
            self.i += 1
            if np.any(self.data[start + 1 : self.marks[self.i - 1]] > 32):
                raise _Unclear
            return spans
        while True:
            spans.append(self._input())
            if self._char() == _CLOSE[0]:
                self.i += 1
                return spans
            self._take(_COMMA)

    def _input(self) -> tuple[int, int] | None:
        found: list[tuple[int, int]] = []

        def member(key: bytes, colon: int) -> None:
            if key != b"data":
                self._skip_value()
                return
            if found:
                raise _Unclear
            # the value's own marks are deeper than the input (not kept) but for a string's quotes
            # and the closing mark of a list or object, which are skipped here
            self._skip_value()
            end = self.marks[self.i]  # the "," or "}" after the value
            found.append(_trim(self.data, colon + 1, end))

        self._members(member)
        return found[0] if found else None


class _Unclear(Exception):
    """The text is not clearly an infer request's outline (``data_spans`` returns None)."""


def _trim(data: np.ndarray, start: int, end: int) -> tuple[int, int]:
    """``start..end`` without the JSON whitespace at either end (raises ``_Unclear`` when nothing is left)."""
    while start < end and data[start] <= 32:
        start += 1
    while end > start and data[end - 1] <= 32:
        end -= 1
    if start == end:
        raise _Unclear
    return start, end


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


def _small(text: bytes | bytearray | memoryview) -> bytes | None:
    """``text`` as ``bytes`` when it is at most one block (a copy of a few KB, or none for ``bytes``),
    else None: ``bytes.count`` is then cheaper than numpy's per-call cost (0.1 against 1.9 µs a count
    for a 130-byte request), and holds the interpreter for at most a block's time."""
    if isinstance(text, bytes):
        return text if len(text) <= BLOCK_BYTES else None
    view = memoryview(text).cast("B")
    return view.tobytes() if len(view) <= BLOCK_BYTES else None


def count_byte(text: bytes | bytearray | memoryview, byte: int) -> int:
    """How many times ``byte`` occurs in ``text`` (over a block: in blocks, with no copy of the text)."""
    small = _small(text)
    if small is not None:
        return small.count(byte)
    data = _bytes(text)
    return sum(
        int(np.count_nonzero(data[start : start + BLOCK_BYTES] == byte))
        for start in range(0, len(data), BLOCK_BYTES)
    )


def upper_bound(text: bytes | bytearray | memoryview) -> int:
    """At least as many as the values a parser builds for the JSON text ``text``: one, plus one per
    comma, colon (an object's key), bracket and brace (a container of k values holds k - 1 commas),
    wherever they are (in strings too). Four byte counts: cheap next to ``scan``."""
    small = _small(text)
    if small is not None:
        return 1 + sum(small.count(c) for c in (_COMMA, _COLON, _OPEN[0], _OPEN[1]))
    return 1 + sum(count_byte(text, c) for c in (_COMMA, _COLON, _OPEN[0], _OPEN[1]))
