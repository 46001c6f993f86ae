"""Open Inference Protocol (KServe v2) REST codec: infer request decoding, response encoding. Pure.

References: the KServe v2 REST protocol (``kserve/open-inference-protocol``, ``rest_predict_v2``) and
Triton's binary tensor data extension (``triton-inference-server/server``,
``docs/protocol/extension_binary_data.md``):

- A request body is a JSON header, optionally followed by raw tensor bytes. The HTTP header
  ``Inference-Header-Content-Length`` gives the JSON's length in bytes; each input sent in binary has
  ``"parameters": {"binary_data_size": N}`` and its N bytes follow in input order.
- Raw layouts: row-major, little-endian, the numpy itemsize of the datatype (BOOL one byte, BF16 two);
  BYTES elements are each a 4-byte little-endian length followed by the bytes (as
  ``tritonclient.utils.serialize_byte_tensor`` writes them).
- Outputs are binary when the output's ``parameters.binary_data`` is true, else when the request's
  ``parameters.binary_data_output`` is true (what ``tritonclient.http`` sends when the caller names no
  outputs); the response then has the same layout, with ``Inference-Header-Content-Length``.

Tensors are numpy arrays: BYTES as ``object`` arrays of ``bytes``, BF16 as ``ml_dtypes.bfloat16``.
Errors are ``ProtocolError`` (HTTP 400) whose message names the tensor and what was expected, and
``InputError`` 413 for a request over its ``limits``.

Sizes are judged before anything is built (``decode_request``, and gRPC's decoder through
``RequestBudget``): a shape of more than ``MAX_RANK`` dimensions or of more elements than numpy can
count is a 400; with ``limits``, the elements the shapes declare (all inputs together) and the tensor
bytes they imply (BYTES: the payload the binary data or the strings hold) are checked against
``limits.max_request_elements`` and ``limits.max_request_bytes`` (413) before any tensor is made. A
JSON body is decoded in two steps: first its outline, each input's ``data`` left as undecoded JSON
text (``msgspec.Raw``: checked, not built); then each ``data``, once its JSON values are counted
(``kubeinfer.runtime.jsonscan``) and found to be what the declared shape needs. Every other JSON
field (names, shapes, parameters, outputs) must be small (``MAX_FIELD_BYTES``), and a request has at
most ``MAX_INPUTS`` inputs: what a parser builds for a request is then bounded by its limits, never
by the size of its body.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
from kubeinfer.runtime import jsonscan
from kubeinfer.runtime.config import LimitsConfig
from kubeinfer.runtime.dtypes import NUMPY_DTYPES, datatype_of
from kubeinfer.runtime.errors import InputError, ProtocolError

# byte-order-explicit (little-endian) dtypes of the raw binary layout
_LITTLE = {
    name: dt.newbyteorder("<") for name, dt in NUMPY_DTYPES.items() if name not in ("BYTES", "BOOL", "BF16")
}
_LITTLE["BOOL"] = NUMPY_DTYPES["BOOL"]
_LITTLE["BF16"] = NUMPY_DTYPES["BF16"]

_JSON_DECODER = msgspec.json.Decoder()
_JSON_ENCODER = msgspec.json.Encoder()

#: Most dimensions a shape may have: NumPy 1's limit (NumPy 2's is 64); no model takes more.
MAX_RANK = 32
#: A shape's elements, its zero dimensions left out, stay below this: times the largest itemsize
#: (8 bytes) it is still an int64, numpy's bound on an array's size.
MAX_SHAPE_ELEMENTS = 2**60
#: Most inputs in one request (a model with more inputs than this does not exist).
MAX_INPUTS = 4096
#: Most bytes of JSON in a field other than an input's ``data``: a name, a datatype, a shape, the
#: parameters, the outputs, the id.
MAX_FIELD_BYTES = 64 * 1024
#: JSON values an input's ``data`` may hold beyond twice its declared elements (a flat list, or rows
#: of lists, fit in twice): room for an empty tensor's nesting and small odd ones.
NESTING_ALLOWANCE = 1024
#: Bytes of JSON over which a request's inputs' ``data`` are located before the JSON is parsed
#: (``_outline``); below it parsing the whole text is cheaper than locating them.
OUTLINE_SCAN_BYTES = 1 << 20
#: A field left out of the JSON outline (no JSON value is empty).
_ABSENT = msgspec.Raw(b"")


class _InputOutline(msgspec.Struct):
    """One of a request's ``inputs``, every field left as its JSON text (other fields are skipped)."""

    name: msgspec.Raw = _ABSENT
    datatype: msgspec.Raw = _ABSENT
    shape: msgspec.Raw = _ABSENT
    parameters: msgspec.Raw = _ABSENT
    data: msgspec.Raw = _ABSENT


class _RequestOutline(msgspec.Struct):
    """A request body's fields as JSON text (unknown fields are checked and skipped, not built)."""

    id: msgspec.Raw = _ABSENT
    parameters: msgspec.Raw = _ABSENT
    inputs: msgspec.Raw = _ABSENT
    outputs: msgspec.Raw = _ABSENT


_OUTLINE_DECODER = msgspec.json.Decoder(_RequestOutline)
_INPUTS_DECODER = msgspec.json.Decoder(list[_InputOutline])


@dataclass
class InferRequest:
    """A decoded infer request.

    Attributes:
        id: the request's ``id`` (echoed in the response), or None.
        inputs: input name -> array of the declared shape and datatype.
        outputs: requested output name -> binary flag (None: use ``binary_data_output``); empty = all.
        binary_data_output: request-level default for outputs in binary.
        priority: ``parameters.priority`` (Triton: 1 highest, 0 default) or None.
        timeout_us: ``parameters.timeout`` (microseconds) or None.
        parameters: every request-level parameter as sent.
        shm_inputs: inputs left in a registered shared-memory region: name -> (datatype, shape, where).
        shm_outputs: outputs to write into a region: name -> where (also in ``outputs``).
    """

    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: dict[str, bool | None] = field(default_factory=dict)
    binary_data_output: bool = False
    priority: Any = None
    timeout_us: Any = None
    parameters: dict[str, Any] = field(default_factory=dict)
    shm_inputs: dict[str, SharedInput] = field(default_factory=dict)
    shm_outputs: dict[str, RegionRef] = field(default_factory=dict)


@dataclass(frozen=True)
class RegionRef:
    """Where a tensor lies in a registered shared-memory region (Triton's shared-memory extension):
    the region's name, the offset in it and the size, in bytes."""

    region: str
    offset: int
    byte_size: int


#: An input left in shared memory: its datatype, shape and place.
SharedInput = tuple[str, list[int], RegionRef]


def cache_parameter(value: Any) -> bool:
    """A request's ``cache`` parameter: whether it may be answered from, and fill, the response cache
    (absent: yes).

    Raises:
        ProtocolError: 400 for a value that is no boolean.
    """
    if value is None:
        return True
    if not isinstance(value, bool):
        raise ProtocolError(f"parameter 'cache' must be true or false, got {value!r:.40}")
    return value


def region_ref(name: str, params: Mapping[str, Any], what: str) -> RegionRef | None:
    """The region a tensor's parameters name (``shared_memory_region``, ``shared_memory_byte_size``,
    ``shared_memory_offset`` default 0), or None when they name none.

    Args:
        name: the tensor's name; what: "input tensor" or "output" (messages name both).

    Raises:
        ProtocolError: 400 for a region name that is no string, or a size or offset that is no
            non-negative integer.
    """
    region = params.get("shared_memory_region")
    if region is None:
        return None
    size, offset = params.get("shared_memory_byte_size"), params.get("shared_memory_offset", 0)
    if not isinstance(region, str) or not region:
        raise ProtocolError(f"{what} '{name}': shared_memory_region must be a region name", tensor=name)
    for key, value in (("shared_memory_byte_size", size), ("shared_memory_offset", offset)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ProtocolError(
                f"{what} '{name}': {key} must be a non-negative integer, got {value!r}", tensor=name
            )
    assert isinstance(size, int) and isinstance(offset, int)
    return RegionRef(region, offset, size)


def _elements(shape: Sequence[int]) -> int:
    return math.prod(shape)


def declared_elements(shape: Sequence[int]) -> int:
    """The elements a shape declares, its zero dimensions left out: what its nested JSON lists or its
    rows may hold at most (``[10**12, 0]`` declares 10**12 although it holds none). Pure arithmetic on
    Python integers: no overflow."""
    return math.prod(d for d in shape if d)


def check_shape(shape: Sequence[int], name: str) -> None:
    """Check a shape's rank and size before anything is made of that shape.

    Args:
        shape: the dimensions as sent (non-negative integers).
        name: the tensor's name (the message names it).

    Raises:
        ProtocolError: 400 for a negative dimension, more than ``MAX_RANK`` dimensions, or more
            elements (``declared_elements``) than ``MAX_SHAPE_ELEMENTS``.
    """
    if len(shape) > MAX_RANK:
        raise ProtocolError(
            f"input tensor '{name}': shape has {len(shape)} dimensions, at most {MAX_RANK}", tensor=name
        )
    if any(d < 0 for d in shape):
        raise ProtocolError(
            f"input tensor '{name}': shape {list(shape)} has a negative dimension", tensor=name
        )
    if declared_elements(shape) >= MAX_SHAPE_ELEMENTS:
        raise ProtocolError(
            f"input tensor '{name}': shape {list(shape)} has more elements than an array can hold",
            tensor=name,
        )


def _shape(raw: Any, name: str) -> list[int]:
    if not isinstance(raw, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw
    ):
        raise ProtocolError(
            f"input tensor '{name}': 'shape' must be a list of non-negative integers, got {raw!r:.80}",
            tensor=name,
        )
    check_shape(raw, name)
    return raw


class RequestBudget:
    """What the inputs of one request declare, against ``limits`` (None: no limits), counted before
    any tensor is made: every transport's decoder declares each input's shape (``declare``) and,
    for BYTES, the payload its data holds (``payload``), and is refused at the first one over.

    The counts are those ``ServableModel.validate`` checks once the tensors exist, with the same
    messages; the elements of a shape with a zero dimension are counted without it
    (``declared_elements``), so that its rows count too.

    Raises (``declare``, ``payload``):
        InputError: 413 when the request's elements pass ``limits.max_request_elements`` or its
            tensor bytes pass ``limits.max_request_bytes``.
    """

    def __init__(self, limits: LimitsConfig | None) -> None:
        self.limits = limits
        self.elements = 0
        self.bytes = 0

    def declare(self, name: str, datatype: str, shape: Sequence[int]) -> None:
        """Count an input of ``datatype`` (a protocol datatype) and ``shape`` (checked with
        ``check_shape``): its elements and, but for BYTES, its bytes."""
        limits = self.limits
        if limits is None:
            return
        self.elements += declared_elements(shape)
        self._check(name, self.elements, limits.max_request_elements, "has {} elements")
        if datatype != "BYTES":
            self.payload(name, _elements(shape) * NUMPY_DTYPES[datatype].itemsize)

    def payload(self, name: str, nbytes: int) -> None:
        """Count ``nbytes`` bytes of tensor data of input ``name`` (a BYTES tensor: its elements'
        bytes, without the 4-byte lengths of the binary layout)."""
        if self.limits is None:
            return
        self.bytes += nbytes
        self._check(name, self.bytes, self.limits.max_request_bytes, "carries {} bytes")

    @staticmethod
    def _check(name: str, total: int, limit: int, what: str) -> None:
        if total > limit:
            raise InputError(
                f"input tensor '{name}': request {what.format(total)}, over the limit of {limit}",
                tensor=name,
                status=413,
            )


def deserialize_bytes(buf: bytes | memoryview, count: int, name: str) -> np.ndarray:
    """Parse ``count`` length-prefixed BYTES elements (4-byte little-endian length, then the bytes).

    Returns a 1-D object array of ``bytes``. Raises ``ProtocolError`` if the buffer does not hold exactly
    ``count`` elements."""
    view = memoryview(buf)
    if count * 4 > len(view):  # before allocating: every element takes at least its 4-byte length
        raise ProtocolError(
            f"input tensor '{name}': {count} BYTES elements need at least {count * 4} bytes, "
            f"the data has {len(view)}",
            tensor=name,
        )
    out = np.empty(count, dtype=object)
    pos = 0
    n = len(view)
    for i in range(count):
        if pos + 4 > n:
            raise ProtocolError(
                f"input tensor '{name}': BYTES data ends after {i} of {count} elements "
                "(each element: 4-byte little-endian length, then the bytes)",
                tensor=name,
            )
        (length,) = struct.unpack_from("<I", view, pos)
        pos += 4
        if pos + length > n:
            raise ProtocolError(
                f"input tensor '{name}': BYTES element {i} claims {length} bytes, past the data", tensor=name
            )
        out[i] = bytes(view[pos : pos + length])
        pos += length
    if pos != n:
        raise ProtocolError(
            f"input tensor '{name}': BYTES data has {n - pos} bytes left over after {count} elements",
            tensor=name,
        )
    return out


def serialize_bytes(array: np.ndarray) -> bytes:
    """Length-prefixed serialization of a BYTES (object) array, row-major; ``str`` elements as UTF-8."""
    parts: list[bytes] = []
    for item in array.reshape(-1):
        b = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


def _json_data_values(name: str, shape: list[int], raw: msgspec.Raw) -> Any:
    """An input's ``data``, decoded once its JSON values are known to be what ``shape`` needs.

    A parser builds one object per JSON value, so before it runs: an upper bound of the values from
    four byte counts (``jsonscan.upper_bound``), and when that is over ``2 * elements +
    NESTING_ALLOWANCE`` (strings with commas in them, or a request that lies), the exact counts
    (``jsonscan.scan``): scalars other than the declared elements, or more values than that (lists:
    a flat list or rows of lists fit), are refused without parsing. Raises ``ProtocolError`` 400."""
    count = _elements(shape)
    allowed = 2 * count + NESTING_ALLOWANCE
    if jsonscan.upper_bound(raw) > allowed:
        if jsonscan.first_char(raw) != ord("["):
            raise ProtocolError(f"input tensor '{name}': 'data' must be a (flat or nested) list", tensor=name)
        counts = jsonscan.scan(raw)
        if counts.scalars != count:
            raise ProtocolError(
                f"input tensor '{name}': shape {shape} needs {count} elements, 'data' has {counts.scalars}",
                tensor=name,
            )
        if counts.values > allowed:
            raise ProtocolError(
                f"input tensor '{name}': 'data' holds its {count} elements in {counts.containers} lists, "
                f"more than the {allowed} JSON values allowed (twice the elements, and {NESTING_ALLOWANCE}); "
                "send them as a flat list",
                tensor=name,
            )
    return _decode_field(raw, f"input tensor '{name}': 'data'", tensor=name)


def _decode_field(raw: msgspec.Raw, what: str, tensor: str | None = None) -> Any:
    """The decoded JSON of one field of the request, ``what`` naming it.

    Raises:
        ProtocolError: 400 naming the field, for JSON the decoder refuses (a number outside the float
            range, invalid UTF-8 in a string) or nested too deeply.
    """
    try:
        return _JSON_DECODER.decode(raw)
    except RecursionError:
        raise ProtocolError(f"{what} is not valid JSON: nested too deeply", tensor=tensor) from None
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ProtocolError(f"{what} is not valid JSON: {exc}", tensor=tensor) from None


def _from_json_data(
    name: str, datatype: str, shape: list[int], data: Any, budget: RequestBudget | None = None
) -> np.ndarray:
    if not isinstance(data, list):
        raise ProtocolError(
            f"input tensor '{name}': 'data' must be a (flat or nested) list, got {type(data).__name__}",
            tensor=name,
        )
    if datatype == "BYTES":
        return _from_json_text(name, shape, data, budget)
    try:
        arr = np.asarray(data)
    except ValueError as exc:
        raise ProtocolError(
            f"input tensor '{name}': 'data' is a ragged nested list ({exc})", tensor=name
        ) from None
    count = _elements(shape)
    if arr.size != count:
        raise ProtocolError(
            f"input tensor '{name}': shape {shape} needs {count} elements, 'data' has {arr.size}", tensor=name
        )
    _check_json_kind(name, datatype, arr)
    target = NUMPY_DTYPES[datatype]
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf is checked below
            out = arr.astype(target, casting="unsafe").reshape(shape)
    except (OverflowError, ValueError) as exc:
        raise ProtocolError(
            f"input tensor '{name}': cannot convert 'data' to {datatype}: {exc}", tensor=name
        ) from None
    if datatype in ("FP16", "BF16", "FP32", "FP64") and out.size:
        # JSON has no inf/NaN: a non-finite value here is one the datatype cannot hold (1e300 as FP32,
        # 70000 as FP16) that the cast turned into inf, or a JSON number beyond float64 (1e400)
        finite = np.isfinite(out.astype(np.float64)).reshape(-1)
        if not finite.all():
            bad = arr.reshape(-1)[int(np.argmin(finite))]
            raise ProtocolError(
                f"input tensor '{name}': value {bad} is out of range for {datatype}", tensor=name
            )
    return out


def _from_json_text(
    name: str, shape: list[int], data: list[Any], budget: RequestBudget | None = None
) -> np.ndarray:
    """A BYTES tensor from JSON strings (UTF-8 encoded); the strings' bytes counted in ``budget``
    before they are encoded (a character is at least one byte: the characters are checked first)."""
    count = _elements(shape)
    flat = _flatten(data)
    if len(flat) != count:
        raise ProtocolError(
            f"input tensor '{name}': shape {shape} needs {count} elements, 'data' has {len(flat)}",
            tensor=name,
        )
    chars = 0
    for i, item in enumerate(flat):
        if not isinstance(item, str):
            raise ProtocolError(
                f"input tensor '{name}': BYTES data in JSON must be strings, "
                f"element {i} is {type(item).__name__}",
                tensor=name,
            )
        chars += len(item)
    if budget is not None:
        budget.payload(name, chars)
    out = np.empty(count, dtype=object)
    nbytes = 0
    for i, item in enumerate(flat):
        out[i] = encoded = item.encode("utf-8")
        nbytes += len(encoded)
    if budget is not None:
        budget.payload(name, nbytes - chars)
    return out.reshape(shape)


def _check_json_kind(name: str, datatype: str, arr: np.ndarray) -> None:
    """JSON values of the kind the datatype holds (true/false, integers, numbers), integers in range."""
    kind = arr.dtype.kind if arr.size else None
    if datatype == "BOOL":
        ok = kind in (None, "b")
    elif datatype.startswith(("INT", "UINT")):
        ok = kind in (None, "i", "u")
    else:  # FP16, BF16, FP32, FP64
        ok = kind in (None, "i", "u", "f")
    if not ok:
        raise ProtocolError(
            f"input tensor '{name}': datatype {datatype} expects {_expect(datatype)} in 'data', "
            f"got values like {arr.reshape(-1)[0]!r}",
            tensor=name,
        )
    target = NUMPY_DTYPES[datatype]
    if kind in ("i", "u") and target.kind in ("i", "u"):
        info = np.iinfo(target)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < info.min or hi > info.max:
            raise ProtocolError(
                f"input tensor '{name}': value {lo if lo < info.min else hi} is out of range for {datatype} "
                f"({info.min}..{info.max})",
                tensor=name,
            )


def _expect(datatype: str) -> str:
    if datatype == "BOOL":
        return "true/false"
    if datatype.startswith(("INT", "UINT")):
        return "integers"
    return "numbers"


def _flatten(data: list[Any]) -> list[Any]:
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def tensor_from_raw(
    name: str, datatype: str, shape: Sequence[int], buf: bytes | memoryview, source: str = "its binary data"
) -> np.ndarray:
    """A tensor from its raw layout: the one decoder of the REST binary extension, gRPC's
    ``raw_input_contents`` and the front ends' IPC frames.

    Args:
        name: the tensor's name (error messages name it).
        datatype: a protocol datatype (``kubeinfer.runtime.dtypes.DATATYPES``).
        shape: its dimensions.
        buf: row-major little-endian values (BYTES: each element a 4-byte little-endian length, then the
            bytes).
        source: what holds ``buf``, for the message ("its binary data", "raw_input_contents[0]", "frame").

    Returns an array of ``shape`` and ``datatype``'s numpy dtype, read in place where the layout is the
    host's (``np.frombuffer``: no copy). Raises ``ProtocolError`` if ``buf`` does not hold exactly the
    tensor, the shape fails ``check_shape``, or ``datatype`` is none of the protocol's.
    """
    check_shape(shape, name)
    count = _elements(shape)
    if datatype == "BYTES":
        return deserialize_bytes(buf, count, name).reshape(shape)
    dt = _LITTLE.get(datatype)
    if dt is None:
        raise ProtocolError(
            f"input tensor '{name}': unknown datatype {datatype!r}; one of {', '.join(NUMPY_DTYPES)}",
            tensor=name,
        )
    expected = count * dt.itemsize
    if len(buf) != expected:
        raise ProtocolError(
            f"input tensor '{name}': {datatype} shape {list(shape)} needs {expected} bytes, "
            f"{source} has {len(buf)}",
            tensor=name,
        )
    arr = np.frombuffer(buf, dtype=dt).reshape(shape)
    return arr.astype(NUMPY_DTYPES[datatype], copy=False) if dt != NUMPY_DTYPES[datatype] else arr


def raw_buffer(array: np.ndarray, datatype: str) -> bytes | np.ndarray:
    """The raw layout of ``array`` as ``datatype`` (cast when its dtype differs): the one encoder of the
    REST binary extension, gRPC's ``raw_output_contents`` and the IPC frames.

    Returns a buffer: a C-contiguous little-endian ``uint8`` array (a view of ``array`` when it already
    is one: no copy), or ``bytes`` for BYTES (each element length-prefixed; ``str`` as UTF-8).
    """
    if datatype == "BYTES":
        return serialize_bytes(array)
    # as uint8: a buffer numpy can export whatever the dtype (ml_dtypes' bfloat16 cannot)
    return np.ascontiguousarray(array, dtype=_LITTLE[datatype]).reshape(-1).view(np.uint8)


def decode_request(
    body: bytes | bytearray | memoryview, header_length: int | None = None, limits: LimitsConfig | None = None
) -> InferRequest:
    """Decode an infer request body (JSON, or JSON + binary tensor data).

    Every input's name, datatype and shape is read and checked first (``check_shape``; with
    ``limits``, ``RequestBudget``), and only then is any tensor made: a request whose shapes declare
    more than its limits is refused at the cost of reading its outline. A JSON ``data`` is parsed only
    once its values are counted (``_json_data_values``).

    Args:
        body: the whole (decompressed) HTTP body.
        header_length: the ``Inference-Header-Content-Length`` header (bytes of JSON), or None when the
            body is JSON only.
        limits: the request limits (``limits.max_request_elements``, ``limits.max_request_bytes``),
            or None for none (the codec's own bounds still apply: ``MAX_RANK``, ``MAX_INPUTS``,
            ``MAX_FIELD_BYTES``).

    Raises:
        ProtocolError: malformed JSON or structure, an unknown datatype, shape/data mismatch, binary data
            that does not add up; the message names the tensor.
        InputError: 413 for a request over ``limits`` (naming the input that passed it).
    """
    if header_length is None:
        header_length = len(body)
    view = memoryview(body).cast("B")
    outline, params, raw_inputs = _outline(view, header_length)
    budget = RequestBudget(limits)
    plans: list[_Plan] = []
    names: set[str] = set()
    pos = header_length
    for i, raw in enumerate(raw_inputs):
        plan = _plan_input(i, raw, view, pos, names, budget)
        plans.append(plan)
        names.add(plan.name)
        pos = plan.end
    if pos != len(view):
        raise ProtocolError(f"request body has {len(view) - pos} bytes after the last input's binary data")
    outputs, shm_outputs = _outputs(outline.outputs)
    rid = _request_id(outline.id)
    inputs: dict[str, np.ndarray] = {}
    shm_inputs: dict[str, SharedInput] = {}
    for plan in plans:
        if plan.region is not None:
            shm_inputs[plan.name] = (plan.datatype, plan.shape, plan.region)
        else:
            inputs[plan.name] = _materialize(plan, view, budget)
    return InferRequest(
        id=rid,
        inputs=inputs,
        outputs=outputs,
        binary_data_output=_flag(params, "binary_data_output"),
        priority=params.get("priority"),
        timeout_us=params.get("timeout"),
        parameters=params,
        shm_inputs=shm_inputs,
        shm_outputs=shm_outputs,
    )


def _outputs(raw: msgspec.Raw) -> tuple[dict[str, bool | None], dict[str, RegionRef]]:
    """The request's ``outputs``: name -> its ``binary_data`` flag or None, and name -> the region to write
    it into. JSON null is an absent list; any other value that is not a list (false, 0, "", {}) is a
    ``ProtocolError``, not read as "all outputs"."""
    raw_outputs = _small(raw, "request 'outputs'")
    if raw_outputs is None:
        raw_outputs = []
    if not isinstance(raw_outputs, list):
        raise ProtocolError("request 'outputs' must be a list")
    outputs: dict[str, bool | None] = {}
    shm_outputs: dict[str, RegionRef] = {}
    for i, item in enumerate(raw_outputs):
        name, flag, ref = _output(i, item)
        outputs[name] = flag
        if ref is not None:
            shm_outputs[name] = ref
    return outputs, shm_outputs


def _request_id(raw: msgspec.Raw) -> str | None:
    """The request's ``id``: a string, or a number kept as its text; None when absent or null. A boolean,
    a list or an object is a ``ProtocolError``, not sent back as its Python text ("False")."""
    rid = _small(raw, "request 'id'")
    if rid is None or isinstance(rid, str):
        return rid
    if isinstance(rid, bool) or not isinstance(rid, int | float):
        raise ProtocolError(f"request 'id' must be a string, got {type(rid).__name__}")
    return str(rid)


@dataclass
class _Plan:
    """One input as its outline declares it, checked, before its tensor is made: its ``data`` (JSON
    text), its binary data (``start``..``end`` of the body) or its shared-memory region."""

    name: str
    datatype: str
    shape: list[int]
    data: msgspec.Raw | None
    start: int
    end: int
    region: RegionRef | None = None


def _small(raw: msgspec.Raw, what: str) -> Any:
    """The decoded JSON of a field that is small by nature (``MAX_FIELD_BYTES`` at most), None when
    absent. Raises ``ProtocolError`` 400 for a larger one."""
    if not len(raw):
        return None
    if len(raw) > MAX_FIELD_BYTES:
        raise ProtocolError(f"{what} has {len(raw)} bytes of JSON, more than the {MAX_FIELD_BYTES} allowed")
    return _decode_field(raw, what)


def _header(view: memoryview, header_length: int) -> tuple[_RequestOutline, dict[str, Any]]:
    """The request's JSON outline (the first ``header_length`` bytes) and its ``parameters``."""
    if not 0 <= header_length <= len(view):
        raise ProtocolError(
            f"Inference-Header-Content-Length {header_length} is outside the body of {len(view)} bytes"
        )
    try:
        outline = _OUTLINE_DECODER.decode(view[:header_length])
    except msgspec.ValidationError:
        raise ProtocolError("request body must be a JSON object with an 'inputs' list") from None
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("request body is not valid JSON: nested too deeply") from None
    params = _small(outline.parameters, "request 'parameters'")
    if params is None:
        params = {}
    if not isinstance(params, dict):  # false, 0, "" or [] too: refused, not read as no parameters
        raise ProtocolError("request 'parameters' must be a JSON object")
    return outline, params


def _outline(
    view: memoryview, header_length: int
) -> tuple[_RequestOutline, dict[str, Any], list[_InputOutline]]:
    """The request's JSON outline, its ``parameters`` and its inputs' outlines.

    Over ``OUTLINE_SCAN_BYTES`` of JSON, the inputs' ``data`` are located first (``jsonscan.data_spans``:
    numpy, the GIL released) and the JSON is parsed without them, each ``data`` left as its text in
    ``view`` (parsed once it is counted): parsing a large ``data`` only to skip it would hold the
    interpreter (64 MB of numbers: about 90 ms, the liveness probe's answer waiting behind it). When the
    JSON is not clearly a request's outline, it is parsed whole. Raises ``ProtocolError``."""
    if OUTLINE_SCAN_BYTES < header_length <= len(view):
        header = view[:header_length]
        spans = jsonscan.data_spans(header)
        if spans is not None and any(spans):
            pieces: list[bytes | memoryview] = []
            at = 0
            for span in spans:
                if span is not None:
                    pieces += [header[at : span[0]], b"0"]
                    at = span[1]
            pieces.append(header[at:])
            skeleton = memoryview(b"".join(pieces))
            outline, params = _header(skeleton, len(skeleton))
            raw_inputs = _input_outlines(outline.inputs)
            if len(raw_inputs) == len(spans) and all(
                (span is None) == (not len(raw.data)) for raw, span in zip(raw_inputs, spans, strict=True)
            ):
                for raw, span in zip(raw_inputs, spans, strict=True):
                    if span is not None:
                        raw.data = msgspec.Raw(header[span[0] : span[1]])
                return outline, params, raw_inputs
    outline, params = _header(view, header_length)
    return outline, params, _input_outlines(outline.inputs)


def _input_outlines(raw: msgspec.Raw) -> list[_InputOutline]:
    """The outlines of a request's ``inputs``: at most ``MAX_INPUTS``, counted before they are made
    (each ``{`` may open one; only when there are more is the list scanned). Raises ``ProtocolError``."""
    if not len(raw):
        raise ProtocolError("request must have a non-empty 'inputs' list")
    if jsonscan.count_byte(raw, ord("{")) > MAX_INPUTS:
        items = jsonscan.scan(raw).items
        if items > MAX_INPUTS:
            raise ProtocolError(f"request has {items} inputs, more than the {MAX_INPUTS} allowed")
    try:
        outlines = _INPUTS_DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        where = re.search(r"\$\[(\d+)\]", str(exc))
        if where is None:
            raise ProtocolError("request must have a non-empty 'inputs' list") from None
        raise ProtocolError(f"inputs[{where.group(1)}] must be an object with a string 'name'") from None
    except RecursionError:
        raise ProtocolError("request body is not valid JSON: nested too deeply") from None
    if not outlines:
        raise ProtocolError("request must have a non-empty 'inputs' list")
    return outlines


def _plan_input(
    i: int, raw: _InputOutline, view: memoryview, pos: int, seen: set[str], budget: RequestBudget
) -> _Plan:
    """Check ``inputs[i]``'s declaration (name, datatype, shape, parameters, where its data is) and
    count it in ``budget``; its binary data (if any) starts at ``pos`` of the body."""
    name = _small(raw.name, f"inputs[{i}] 'name'")
    if not isinstance(name, str):
        raise ProtocolError(f"inputs[{i}] must be an object with a string 'name'")
    if name in seen:
        raise ProtocolError(f"input tensor '{name}' is given twice", tensor=name)
    datatype = _small(raw.datatype, f"input tensor '{name}': 'datatype'")
    if not isinstance(datatype, str) or datatype not in NUMPY_DTYPES:
        raise ProtocolError(
            f"input tensor '{name}': unknown datatype {datatype!r:.40}; one of {', '.join(NUMPY_DTYPES)}",
            tensor=name,
        )
    shape = _shape(_small(raw.shape, f"input tensor '{name}': 'shape'"), name)
    tparams = _small(raw.parameters, f"input tensor '{name}': 'parameters'")
    if tparams is None:
        tparams = {}
    if not isinstance(tparams, dict):
        raise ProtocolError(f"input tensor '{name}': 'parameters' must be an object", tensor=name)
    budget.declare(name, datatype, shape)
    ref = region_ref(name, tparams, "input tensor")
    if ref is not None:
        return _Plan(name, datatype, shape, None, pos, pos, region=ref)
    size = tparams.get("binary_data_size")
    if size is not None:
        _check_binary_size(name, size, len(view) - pos)
        if datatype == "BYTES":  # the elements' bytes: the data less a 4-byte length each
            budget.payload(name, max(0, size - 4 * _elements(shape)))
        return _Plan(name, datatype, shape, None, pos, pos + size)
    if len(raw.data):
        return _Plan(name, datatype, shape, raw.data, pos, pos)
    raise ProtocolError(
        f"input tensor '{name}' has neither 'data' nor parameters.binary_data_size", tensor=name
    )


def _check_binary_size(name: str, size: Any, left: int) -> None:
    """An input's ``binary_data_size``: a non-negative integer within the ``left`` bytes of the body.
    Raises ``ProtocolError`` 400."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ProtocolError(
            f"input tensor '{name}': binary_data_size must be a non-negative integer", tensor=name
        )
    if size > left:
        raise ProtocolError(
            f"input tensor '{name}': binary_data_size {size} runs past the end of the body "
            f"({left} bytes left; is Inference-Header-Content-Length set?)",
            tensor=name,
        )


def _materialize(plan: _Plan, view: memoryview, budget: RequestBudget) -> np.ndarray:
    """The tensor of a checked ``_Plan``: from its JSON ``data`` or its binary data in ``view``."""
    if plan.data is None:
        return tensor_from_raw(plan.name, plan.datatype, plan.shape, view[plan.start : plan.end])
    data = _json_data_values(plan.name, plan.shape, plan.data)
    return _from_json_data(plan.name, plan.datatype, plan.shape, data, budget)


def _flag(params: Mapping[str, Any], name: str) -> bool:
    """The boolean request parameter ``name`` (absent or null: false). Raises ProtocolError (400) for
    anything but JSON true/false: ``"false"`` is not false (Triton's server refuses it too)."""
    value = params.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ProtocolError(f"request parameter '{name}' must be true or false, got {value!r}")
    return value


def _output(i: int, raw: Any) -> tuple[str, bool | None, RegionRef | None]:
    """``outputs[i]``: (name, its ``binary_data`` flag or None, the region to write it into or None)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise ProtocolError(f"outputs[{i}] must be an object with a string 'name'")
    oparams = raw.get("parameters")
    if oparams is None:
        oparams = {}
    if not isinstance(oparams, dict):
        raise ProtocolError(f"output '{raw['name']}': 'parameters' must be an object")
    if oparams.get("classification"):
        raise ProtocolError(f"output '{raw['name']}': the classification extension is not supported")
    flag = oparams.get("binary_data")
    if flag is not None and not isinstance(flag, bool):  # Triton's server takes JSON true/false only
        raise ProtocolError(
            f"output '{raw['name']}': parameter 'binary_data' must be true or false, got {flag!r}",
            tensor=raw["name"],
        )
    return raw["name"], flag, region_ref(raw["name"], oparams, "output")


def _json_data(array: np.ndarray, datatype: str) -> list[Any]:
    flat = array.reshape(-1)
    if datatype == "BYTES":
        out: list[Any] = []
        for item in flat:
            b = item if isinstance(item, bytes | bytearray) else str(item).encode("utf-8")
            try:
                out.append(bytes(b).decode("utf-8"))
            except UnicodeDecodeError:
                raise ProtocolError(
                    "output is not UTF-8 text and cannot be sent as JSON; request it with binary_data"
                ) from None
        return out
    if datatype == "BF16":
        bf: list[Any] = flat.astype(np.float32).tolist()
        return bf
    values: list[Any] = flat.tolist()
    return values


def check_outputs(requested: InferRequest | Iterable[str], model_name: str, declared: Sequence[str]) -> None:
    """Check that every output a request names (``requested``: the request, or the names) is one of the
    model's ``declared`` outputs; no names means all of them.

    Raises:
        ProtocolError: an unknown output (400), naming it and the model's outputs.
    """
    names = requested.outputs if isinstance(requested, InferRequest) else requested
    for name in names:
        if name not in declared:
            raise ProtocolError(
                f"unknown output '{name}' requested; model '{model_name}' has: {', '.join(declared)}"
            )


def encode_response(
    model_name: str,
    outputs: Mapping[str, np.ndarray],
    request: InferRequest,
    *,
    datatypes: Mapping[str, str] | None = None,
    model_version: str = "1",
) -> tuple[bytes, int | None]:
    """Encode an infer response.

    Args:
        outputs: output name -> array (this request's rows).
        request: the decoded request (which outputs, binary or JSON).
        datatypes: declared datatype per output (default: from the array's dtype); arrays are cast.

    Returns:
        ``(body, header_length)``; ``header_length`` is the ``Inference-Header-Content-Length`` to send
        when any output is binary, else None (the body is JSON only).

    The requested outputs (``request.outputs``) must be among ``outputs``: ``check_outputs`` checks
    them against the model's declaration when the request arrives, before it is queued.
    """
    names = list(request.outputs) if request.outputs else list(outputs)
    entries: list[dict[str, Any]] = []
    blobs: list[Any] = []  # bytes, or uint8 arrays (raw_buffer)
    for name in names:
        array = outputs[name]
        datatype = (datatypes or {}).get(name) or datatype_of(array)
        if datatype != "BYTES" and array.dtype != NUMPY_DTYPES[datatype]:
            array = array.astype(NUMPY_DTYPES[datatype])
        flag = request.outputs.get(name)
        binary = request.binary_data_output if flag is None else flag
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        ref = request.shm_outputs.get(name)
        if ref is not None:
            # written into the region by the data plane: neither data nor parameters, as Triton's HTTP
            # server answers it (its C++ client reads any output with parameters as binary data)
            pass
        elif binary:
            blob = raw_buffer(array, datatype)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = _json_data(array, datatype)
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": entries}
    if request.id is not None:
        doc["id"] = request.id
    header = _JSON_ENCODER.encode(doc)
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


def encode_json(doc: Any) -> bytes:
    """JSON bytes of ``doc`` (msgspec)."""
    return _JSON_ENCODER.encode(doc)
