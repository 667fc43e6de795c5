"""``python -m candle_trace ARGS...`` runs the candle-trace command (see _cli.py)."""

import sys

from ._cli import main

sys.exit(main())
