"""The exceptions of the binding (re-exported by ``candle_trace`` and ``candle_trace.session``)."""

from __future__ import annotations

from ._lib import Status


class CandleTraceError(Exception):
    """A call into the library failed, or the binding refused its arguments.

    ``status`` is the ``ct_status`` (a :class:`Status`, whose ``name`` is the header's,
    e.g. ``"CT_ERR_INVALID_ARGUMENT"``); ``message`` is ``ct_last_error()`` of the call, or
    the binding's own message when it refused the call before reaching the library.
    """

    def __init__(self, status: int, message: str) -> None:
        try:
            self.status: Status = Status(status)
        except ValueError:  # a status this binding does not know (a newer library)
            self.status = status  # type: ignore[assignment]
        self.message = message
        name = getattr(self.status, "name", f"ct_status({status})")
        super().__init__(f"{message} [{name}]")


class CandleTraceTypeError(CandleTraceError, TypeError):
    """An argument of the wrong type (a str where a sequence of ids is expected, a float
    where an integer is, ...), refused by the binding before any call into the library.
    ``status`` is ``CT_ERR_INVALID_ARGUMENT``; the message names the function and the
    argument."""


class CandleTraceValueError(CandleTraceError, ValueError):
    """An argument of the right type with a value the call cannot take (a negative
    dimension, data whose length disagrees with its shape, a NUL character in a string),
    refused by the binding before any call into the library. ``status`` is
    ``CT_ERR_INVALID_ARGUMENT``; the message names the function and the argument."""
