"""The signal dispositions a program started from a terminal has, for the suites'
children.

The signal tests send SIGINT, SIGHUP and SIGQUIT to children and expect what a program
started from a terminal does. A suite started in the background (``make test &``,
``nohup``) inherits those signals ignored, and an ignored signal stays ignored across
exec: Python then installs no KeyboardInterrupt handler, and the drop-in shim leaves
SIGHUP alone (it takes only signals at SIG_DFL). Both conftests call :func:`restore`."""
from __future__ import annotations

import signal


def restore() -> None:
    """Un-ignores SIGINT (Python's KeyboardInterrupt handler), SIGHUP and SIGQUIT."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGHUP, signal.SIGQUIT):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)
