"""candle_trace: Python binding of candle-trace, a profiler that writes one training
(or inference) step as a candle-graph/trace/10 JSONL trace.

    import candle_trace as ct

    with ct.Session("trace.jsonl", "mlp::train", capture_step=3) as s:
        with s.measure("update"):
            with s.span("forward", kind="module", step="forward"):
                ...

The PyTorch integration is ``candle_trace.torch`` (imported on demand).
"""

from ._lib import (
    CT_ABI_VERSION,
    Category,
    GradientState,
    LibraryNotFound,
    MemoryAction,
    SpanKind,
    Status,
    Step,
)
from .session import (
    ROOT_SPAN,
    CandleTraceError,
    CandleTraceTypeError,
    CandleTraceValueError,
    Session,
    Span,
    abi_version,
    gradient_contract,
    version,
)

__all__ = [
    "CT_ABI_VERSION",
    "Category",
    "CandleTraceError",
    "CandleTraceTypeError",
    "CandleTraceValueError",
    "GradientState",
    "LibraryNotFound",
    "MemoryAction",
    "ROOT_SPAN",
    "Session",
    "Span",
    "SpanKind",
    "Status",
    "Step",
    "abi_version",
    "gradient_contract",
    "version",
]
__version__ = "0.1.0"
