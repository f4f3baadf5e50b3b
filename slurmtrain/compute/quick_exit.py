"""Leave the attempt's process at once when its work is done and durable.

After the last collective CPython still finalises every module (1.6 s here with torch, deepspeed
and transformers loaded; 0.1 s without), and srun waits for its slowest task before the next
attempt. The entrypoint calls `arm` first; `leave(code)` is `sys.exit(code)`, so the interpreter
shuts down as always (joins non-daemon threads, runs atexit handlers newest first) until the
handler `arm` registered, the oldest, runs last: it flushes logging and stdio and ends the process
with os._exit, skipping only the module teardown. Any other exit (an exception, a usage error)
shuts down normally.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import NoReturn

_LEAVING: list[int] = []  # the code `leave` was given; empty: a normal shutdown


def arm() -> None:
    """Register the process's last atexit handler (call it before anything registers one that
    must run: handlers registered earlier would run after it, i.e. never)."""
    atexit.register(_end)


def leave(code: int) -> NoReturn:
    """Exit with `code` without the interpreter's module teardown (once `arm` ran)."""
    _LEAVING.append(code)
    sys.exit(code)


def _end() -> None:
    if not _LEAVING:
        return
    logging.shutdown()  # registered at `import logging`, before `arm`: it would never run
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken: nothing left to say there
            pass
    os._exit(_LEAVING[-1])
