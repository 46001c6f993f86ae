"""gRPC ``ModelInferRequest`` with its inputs' typed ``contents`` kept serialized until they are counted.

grpc parses a request before the handler sees it, and protobuf's parser makes an entry per value of
a repeated field: 16 bytes (upb's string view) for each ``bytes_contents`` element, which takes 2
bytes on the wire, 8 bytes for an ``int64_contents`` value sent in 1. Measured on the tiny model, 4M
empty ``bytes_contents`` (an 8 MB message) took 147 MB, kept after the 413. So the server parses
``ModelInfer`` requests as ``LazyModelInferRequest``: Triton's ``inference.ModelInferRequest`` (same
fields, names and numbers: it parses the same bytes and reads the same), except that each input's
``contents`` stays the bytes of its ``InferTensorContents`` message. ``count_values`` counts the
values in those bytes without making them (stopping past a bound), and ``parse_contents`` parses
them once they are known to be no more than the input's shape declares.

Pure: protobuf descriptors and arithmetic on bytes, no I/O.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor, FileDescriptor
from tritonclient.grpc import service_pb2

_PACKAGE = "kubeinfer.lazy"
#: Bytes of a packed field compared at once (scratch memory, not the field's size).
_BLOCK = 1 << 16
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
#: Bytes per value of the packed fixed-width fields of ``InferTensorContents``.
_FIXED_WIDTH = {FieldDescriptor.TYPE_FLOAT: 4, FieldDescriptor.TYPE_DOUBLE: 8}
#: ``InferTensorContents`` field number -> (its name, its protobuf type).
_CONTENTS_FIELDS = {f.number: (f.name, f.type) for f in service_pb2.InferTensorContents.DESCRIPTOR.fields}


def _add_with_dependencies(
    pool: descriptor_pool.DescriptorPool, file: FileDescriptor, added: set[str]
) -> None:
    if file.name in added:
        return
    for dependency in file.dependencies:
        _add_with_dependencies(pool, dependency, added)
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    pool.Add(proto)
    added.add(file.name)


def _rename(message: descriptor_pb2.DescriptorProto, old: str, new: str) -> None:
    """Point the fields of ``message`` (and of its nested types) that name a type under ``old`` to the
    same type under ``new``; ``InferInputTensor.contents`` becomes ``bytes``."""
    for field in message.field:
        if message.name == "InferInputTensor" and field.name == "contents":
            field.type = FieldDescriptor.TYPE_BYTES
            field.ClearField("type_name")
        elif field.type_name.startswith(old + "."):
            field.type_name = new + field.type_name[len(old) :]
    for nested in message.nested_type:
        _rename(nested, old, new)


def _lazy_request_class() -> Any:
    """``ModelInferRequest`` with ``InferInputTensor.contents`` as bytes, in a pool of its own (beside
    copies of Triton's proto files, whose ``InferParameter`` it uses)."""
    original = service_pb2.ModelInferRequest.DESCRIPTOR
    pool = descriptor_pool.DescriptorPool()
    _add_with_dependencies(pool, original.file, set())
    message = descriptor_pb2.DescriptorProto()
    original.CopyToProto(message)
    _rename(message, "." + original.full_name, f".{_PACKAGE}.{original.name}")
    file = descriptor_pb2.FileDescriptorProto(
        name="kubeinfer_lazy_infer_request.proto",
        package=_PACKAGE,
        syntax="proto3",
        dependency=[original.file.name],
    )
    file.message_type.add().CopyFrom(message)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{original.name}"))


#: ``inference.ModelInferRequest`` whose inputs' ``contents`` are bytes (``FromString`` parses a
#: ModelInfer request; every other field reads as in the original).
LazyModelInferRequest: Any = _lazy_request_class()


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it. Raises ``ValueError`` past the end."""
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _packed_count(data: memoryview, field_type: int) -> int:
    """How many values a packed repeated field's bytes hold: fixed-width, or varints (one per byte
    under 0x80: every varint ends with one)."""
    width = _FIXED_WIDTH.get(field_type)
    if width is not None:
        return len(data) // width
    values = np.frombuffer(data, np.uint8)
    return sum(
        int(np.count_nonzero(values[start : start + _BLOCK] < 0x80))
        for start in range(0, len(values), _BLOCK)
    )


def count_values(contents: bytes, bound: int) -> tuple[dict[str, int], bool]:
    """Count the values of each field of a serialized ``InferTensorContents`` without parsing it.

    Args:
        contents: the message's bytes (``LazyModelInferRequest``'s ``inputs[i].contents``).
        bound: stop once more values than this are counted (each entry is read in Python: a message
            of millions of elements costs ``bound`` steps at most).

    Returns:
        (field name -> values counted, complete): ``complete`` is False when the count stopped past
        ``bound`` (the counts are then lower bounds). Malformed bytes are not judged here (the parse
        that follows refuses them); the counts stop where they stop making sense.
    """
    data = memoryview(contents).cast("B")
    counts: dict[str, int] = {}
    total = pos = 0
    try:
        while pos < len(data):
            key, pos = _varint(data, pos)
            number, wire = key >> 3, key & 7
            name, field_type = _CONTENTS_FIELDS.get(number, ("", 0))
            if wire == _LENGTH:
                length, pos = _varint(data, pos)
                chunk = data[pos : pos + length]
                pos += length
                n = 1 if field_type in (FieldDescriptor.TYPE_BYTES, 0) else _packed_count(chunk, field_type)
            elif wire == _VARINT:
                _, pos = _varint(data, pos)
                n = 1
            elif wire in (_FIXED32, _FIXED64):
                pos += 4 if wire == _FIXED32 else 8
                n = 1
            else:
                break
            if name:
                counts[name] = counts.get(name, 0) + n
                total += n
                if total > bound:
                    return counts, False
    except ValueError:
        pass
    return counts, True


def parse_contents(contents: bytes) -> Any:
    """The ``InferTensorContents`` message of ``contents`` (once ``count_values`` found it small).
    Raises protobuf's ``DecodeError`` on malformed bytes."""
    return service_pb2.InferTensorContents.FromString(contents)
