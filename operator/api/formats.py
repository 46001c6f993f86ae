"""The string formats of the API: durations, resource quantities, names, keys and labels.

Each is a pattern the CRD's schema carries (``type: string`` + ``pattern``) and pydantic checks, with
the parser the operator uses: :func:`parse_duration`, :func:`format_duration`, :func:`cpu_cores`.
This module imports no other module of the API.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler, StringConstraints
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from kubeinfer.contract.durations import DURATION_PATTERN as DURATION_PATTERN
from kubeinfer.contract.durations import parse_duration as parse_duration

# --- durations -------------------------------------------------------------------------------------

# The grammar (``DURATION_PATTERN``) and :func:`parse_duration` live in ``kubeinfer.contract.durations``:
# the activator reads a spec's durations too.


def format_duration(seconds: float, *, significant: int | None = None) -> str:
    """Render float seconds as the shortest exact-enough Go duration string.

    Sub-second values are rendered in ms (``0.005`` → ``"5ms"``, ``0.0125`` → ``"12.5ms"``), values
    below 1 ms in us, others in s (``90.0`` → ``"90s"``). Precision: 3 decimals of the unit.
    ``parse_duration(format_duration(x))`` equals ``x`` to within 1 ns. ``significant``: round
    ``seconds`` to that many significant digits first, for a measured value that a person reads
    (``0.023353``, 3 → ``"23.4ms"``).

    Raises:
        ValueError: ``seconds`` is negative, NaN or infinite.
    """
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"duration must be finite and >= 0, got {seconds!r}")
    if significant is not None:
        seconds = float(f"{seconds:.{significant}g}")
    if seconds == 0:
        return "0s"
    if seconds < 1e-3:
        value, unit = seconds * 1e6, "us"
    elif seconds < 1.0:
        value, unit = seconds * 1e3, "ms"
    else:
        value, unit = seconds, "s"
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    if text == "0":  # below 1 ns resolution of the chosen unit's 3 decimals
        text, unit = f"{seconds * 1e9:.0f}", "ns"
    return f"{text}{unit}"


class Seconds(float):
    """A duration of the API, parsed once: its value is float seconds, and it keeps the text it was
    written as (:attr:`text`), which is what it serializes to (a spec read back writes the same
    string). ``Seconds("10ms") == 0.01``; ``str(Seconds("10ms")) == "10ms"``.

    Raises:
        ValueError: the text is not a duration (:func:`parse_duration`).
    """

    text: str

    def __new__(cls, text: str) -> Seconds:
        value = super().__new__(cls, parse_duration(text))
        value.text = text
        return value

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Seconds({self.text!r})"

    def __reduce__(self) -> tuple[type[Seconds], tuple[str]]:
        return (Seconds, (self.text,))

    @classmethod
    def validate(cls, value: object) -> Seconds:
        """``value`` as :class:`Seconds`: a :class:`Seconds` as it is, a string of
        :data:`DURATION_PATTERN` of at most 64 characters parsed.

        Raises:
            ValueError: anything else (a number too: the API's durations are text with a unit).
        """
        if isinstance(value, Seconds):
            return value
        if not isinstance(value, str):
            raise ValueError(f"expected a duration string such as '10ms', got {type(value).__name__}")
        if len(value) > 64:
            raise ValueError("a duration has at most 64 characters")
        return cls(value)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        """Validated by :meth:`validate`, serialized back to its text."""
        return core_schema.no_info_plain_validator_function(
            cls.validate, serialization=core_schema.plain_serializer_function_ser_schema(str)
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """The CRD's form: ``type: string`` with the pattern and the length limit."""
        return {"type": "string", "maxLength": 64, "pattern": DURATION_PATTERN}


#: A duration field: ``type: string`` + ``pattern`` in the CRD, :class:`Seconds` in Python (float
#: seconds that serialize back to the text given), so no code parses a spec's duration again.
Duration = Seconds

#: A positive Kubernetes resource quantity (``"2"``, ``"500m"``, ``"8Gi"``, ``"1.5"``, ``"1e3"``): the
#: quantity grammar of apimachinery's ``resource.Quantity`` (number, then a binary-SI, decimal-SI or
#: exponent suffix) without a sign and with at least one non-zero digit. apimachinery's own loose
#: pre-check ``^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$`` let ``-1`` (422 on the Deployment),
#: ``0`` / ``.`` (a pod with no memory) and ``1.2.3`` (a 500 from the API server on every retry) through.
QUANTITY_PATTERN = (
    r"^([0-9]*[1-9][0-9]*(\.[0-9]*)?|[0-9]*\.[0-9]*[1-9][0-9]*)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]{1,2})?$"
)
Quantity = Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN, max_length=64)]
_SUFFIX_SCALE = {
    "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
}  # fmt: skip


def cpu_cores(quantity: str) -> float:
    """A ``Quantity`` (``QUANTITY_PATTERN``) as a number: ``"500m"`` -> 0.5, ``"2"`` -> 2.0, ``"1e3"`` ->
    1000.0 (for CPUs: cores; for bytes, ``"64Mi"`` -> 67108864.0). Raises ``ValueError`` for a string
    outside the pattern."""
    match = re.fullmatch(QUANTITY_PATTERN, quantity)
    if match is None:
        raise ValueError(f"not a resource quantity: {quantity!r}")
    suffix = match.group(3) or ""
    number = quantity[: len(quantity) - len(suffix)]
    if suffix[:1] in ("e", "E"):
        return float(number) * 10.0 ** int(suffix[1:])
    return float(number) * _SUFFIX_SCALE.get(suffix, 1.0)


#: A DNS subdomain (RFC 1123), the name of a Secret or a ServiceAccount.
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

# --- names, keys and labels -------------------------------------------------------------------

#: A ConfigMap key (``[-._a-zA-Z0-9]+``, as Kubernetes validates it).
CONFIGMAP_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
#: A key of a Secret's data (``[-._a-zA-Z0-9]+``, as the API server checks it).
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
#: A label key: an optional DNS-subdomain prefix and ``/``, then a name of at most 63 characters.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
#: A label value: empty, or at most 63 alphanumerics, ``-``, ``_`` and ``.``, alphanumeric at both ends.
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"

LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=317, pattern=LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE_PATTERN)]
