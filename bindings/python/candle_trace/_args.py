"""Argument checks of the public API.

Every value a public function passes to the C ABI goes through one of these first: a
wrong type raises :class:`CandleTraceTypeError`, a value the C side cannot take (or
would read as something else: a negative integer wrapping to 2**64 - 1, a dimension of
2**63 wrapping to a negative int64) raises :class:`CandleTraceValueError`. Each message
names the function and the argument. Checks the library makes itself (empty strings,
enum values it does not know, record invariants) are left to it: its message is better
placed. No pointer reaches C unless the memory behind it was sized here.
"""

from __future__ import annotations

import ctypes
import json
import operator
import reprlib
import sys
from collections.abc import Mapping
from typing import Any, Optional

from ._errors import CandleTraceTypeError, CandleTraceValueError
from ._lib import Status

U64_MAX = 2**64 - 1
I64_MAX = 2**63 - 1

_INVALID = Status.CT_ERR_INVALID_ARGUMENT
_repr = reprlib.Repr()
_repr.maxstring = 40
_repr.maxother = 40


def describe(value: Any) -> str:
    """``value`` for a message: its type and a short repr."""
    if value is None:
        return "None"
    return f"{type(value).__name__} {_repr.repr(value)}"


def type_error(fn: str, arg: str, expected: str, value: Any) -> CandleTraceTypeError:
    return CandleTraceTypeError(
        _INVALID, f"candle_trace: {fn}: {arg} must be {expected}, not {describe(value)}")


def value_error(fn: str, arg: str, problem: str) -> CandleTraceValueError:
    return CandleTraceValueError(_INVALID, f"candle_trace: {fn}: {arg} {problem}")


def text(value: Any, fn: str, arg: str, optional: bool = False) -> Optional[bytes]:
    """A string argument as NUL-terminated UTF-8 for C: a str (encoded here) or bytes
    (UTF-8 is checked by the library); None only where ``optional`` (NULL)."""
    if isinstance(value, str):
        try:
            b = value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise value_error(fn, arg, f"is not valid UTF-8: {e}") from None
    elif isinstance(value, bytes):
        b = value
    elif value is None and optional:
        return None
    else:
        raise type_error(fn, arg, "a str or None" if optional else "a str", value)
    if b"\0" in b:
        raise value_error(fn, arg, f"contains a NUL character ({_repr.repr(value)})")
    return b


def string(value: Any, fn: str, arg: str) -> str:
    """A str argument that travels inside JSON."""
    if not isinstance(value, str):
        raise type_error(fn, arg, "a str", value)
    return value


def sequence(value: Any, fn: str, arg: str, expected: str = "a sequence") -> list:
    """An iterable's items. A str, bytes or buffer is refused: iterating it would give
    characters or byte values, never what the argument means."""
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        raise type_error(fn, arg, expected, value)
    try:
        return list(value)
    except TypeError:
        raise type_error(fn, arg, expected, value) from None


def texts(value: Any, fn: str, arg: str) -> list:
    """A sequence of strings (tensor ids) as bytes."""
    items = sequence(value, fn, arg, "a sequence of str (one id is a list of one: [id])")
    return [text(v, fn, f"{arg}[{i}]") for i, v in enumerate(items)]


def strings(value: Any, n: int, fn: str, arg: str, expected: str) -> tuple:
    """A tuple (or list) of exactly ``n`` str."""
    if not isinstance(value, (tuple, list)) or len(value) != n:
        raise type_error(fn, arg, expected, value)
    return tuple(string(v, fn, f"{arg}[{i}]") for i, v in enumerate(value))


def json_text(obj: Any, fn: str, what: str) -> bytes:
    """A JSON argument (run provenance, device options) as UTF-8 for C."""
    try:
        return json.dumps(obj, allow_nan=False).encode()
    except TypeError as e:
        raise CandleTraceTypeError(_INVALID, f"candle_trace: {fn}: {what}: {e}") from None
    except ValueError as e:
        raise CandleTraceValueError(_INVALID, f"candle_trace: {fn}: {what}: {e}") from None


def integer(value: Any, fn: str, arg: str, lo: int = 0, hi: int = U64_MAX) -> int:
    """An integer in [lo, hi] (default: a uint64). bool and float are refused."""
    if value.__class__ is not int:
        if isinstance(value, bool):
            raise type_error(fn, arg, "an integer", value)
        try:
            value = operator.index(value)
        except TypeError:
            raise type_error(fn, arg, "an integer", value) from None
    if not lo <= value <= hi:
        bound = {U64_MAX: "2**64 - 1", I64_MAX: "2**63 - 1"}.get(hi, str(hi))
        raise value_error(fn, arg, f"is {value}, outside {lo}..{bound}")
    return value


def optional_integer(value: Any, fn: str, arg: str) -> Optional[int]:
    return None if value is None else integer(value, fn, arg)


def real(value: Any, fn: str, arg: str, optional: bool = False) -> Optional[float]:
    """A real number as a C double (int, float, or anything with __float__; not a str)."""
    if value.__class__ is float:
        return value
    if value is None and optional:
        return None
    expected = "a real number or None" if optional else "a real number"
    if isinstance(value, (str, bytes, bytearray)):
        raise type_error(fn, arg, expected, value)
    try:
        return float(value)
    except OverflowError:
        raise value_error(fn, arg, f"is too large for a double ({_repr.repr(value)})") from None
    except (TypeError, ValueError):
        raise type_error(fn, arg, expected, value) from None


def flag(value: Any, fn: str, arg: str) -> bool:
    """A bool (or the int 0 or 1)."""
    if value is True or value is False:
        return value
    if value.__class__ is int and value in (0, 1):
        return bool(value)
    raise type_error(fn, arg, "a bool", value)


def mapping(value: Any, fn: str, arg: str) -> Optional[dict]:
    """An optional mapping, copied."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise type_error(fn, arg, "a mapping (a dict) or None", value)
    return dict(value)


def choice(table: Mapping, value: Any, fn: str, arg: str, what: str) -> int:
    """An enum argument: a name of ``table`` (a str) or one of its values (an int or an
    IntEnum member; None where the table has it)."""
    if isinstance(value, (bool, float)):
        raise type_error(fn, arg, f"a {what} name or number", value)
    try:
        return table[value]
    except TypeError:  # unhashable
        raise type_error(fn, arg, f"a {what} name or number", value) from None
    except KeyError:
        names = ", ".join(repr(k) for k in table if isinstance(k, str))
        raise value_error(fn, arg, f"{_repr.repr(value)} is not a {what} (one of: {names})") \
            from None


def shape(value: Any, fn: str, arg: str = "shape") -> tuple:
    """A shape: ``(int64 array or None, rank, element count)``. Each dimension is an
    integer in 0..2**63 - 1 and the element count must fit a uint64."""
    items = sequence(value, fn, arg, "a sequence of non-negative integers")
    dims = [integer(d, fn, f"{arg}[{i}]", 0, I64_MAX) for i, d in enumerate(items)]
    elements = 1
    for d in dims:
        elements *= d
    if elements > U64_MAX:
        raise value_error(fn, arg, f"{dims} has {elements} elements, more than a uint64 counts")
    if not dims:
        return None, 0, 1
    return (ctypes.c_int64 * len(dims))(*dims), len(dims), elements


_F32_FORMATS = {"f", "@f", "=f", "<f" if sys.byteorder == "little" else ">f"}
_BYTE_FORMATS = {"B", "b", "c", "@B", "@b", "=B", "=b", "<B", "<b", ">B", ">b"}


def f32_data(data: Any, n: int, fn: str, dims: list) -> Any:
    """``data`` as a ctypes array of exactly ``n`` float32 (None when n is 0), or an
    error when it does not hold ``n`` elements. ``data`` is a float32 buffer (format
    'f': array('f'), a numpy float32 array, a memoryview of one; any strides), raw bytes
    holding float32 values (bytes, bytearray, a 'B' buffer), or an iterable of real
    numbers."""
    if isinstance(data, str):
        raise type_error(fn, "data", "a float32 buffer or a sequence of real numbers", data)
    try:
        mv = memoryview(data)
    except TypeError:
        mv = None
    if mv is not None:
        if mv.format in _F32_FORMATS:
            count = mv.nbytes // 4
        elif mv.format in _BYTE_FORMATS:
            if mv.nbytes % 4:
                raise value_error(fn, "data", f"has {mv.nbytes} bytes, not a whole number "
                                              f"of float32 (4 bytes each)")
            count = mv.nbytes // 4
        else:
            raise CandleTraceTypeError(
                _INVALID, f"candle_trace: {fn}: data must be float32 (buffer format 'f') or "
                          f"raw bytes, not a buffer of format {mv.format!r}; convert it "
                          f"first (numpy: .astype('float32'))")
        if count != n:
            raise value_error(fn, "data", f"holds {count} float32 elements, but shape "
                                          f"{dims} has {n}")
        if n == 0:
            return None
        # A strided buffer is copied into C order first; either way exactly n floats.
        src = mv.cast("B") if mv.c_contiguous else mv.tobytes()
        return (ctypes.c_float * n).from_buffer_copy(src)
    try:
        known = len(data)
    except TypeError:
        known = None
    if known is not None and known != n:
        raise value_error(fn, "data", f"holds {known} elements, but shape {dims} has {n}")
    try:
        it = iter(data)
    except TypeError:
        raise type_error(fn, "data", "a float32 buffer or a sequence of real numbers",
                         data) from None
    vals = []
    for v in it:  # an iterator without a length: stop one past what the shape allows
        if len(vals) == n:
            raise value_error(fn, "data", f"holds more than the {n} elements of shape {dims}")
        vals.append(v)
    if len(vals) != n:
        raise value_error(fn, "data", f"holds {len(vals)} elements, but shape {dims} has {n}")
    if n == 0:
        return None
    try:
        return (ctypes.c_float * n)(*vals)
    except (TypeError, OverflowError):  # name the element
        return (ctypes.c_float * n)(*[real(v, fn, f"data[{i}]") for i, v in enumerate(vals)])
