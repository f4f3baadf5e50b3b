"""Leave the attempt's process at once when its work is done and durable.

After the last collective CPython still finalises every module (seconds per rank with torch,
deepspeed and transformers loaded), and srun waits for its slowest task before the next attempt.
`leave` does what a normal exit must (joins non-daemon threads, runs atexit handlers, flushes
stdio) and skips the rest with os._exit.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading


def leave(code: int) -> None:
    """Exit with `code` without the interpreter's module teardown."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()  # as interpreter shutdown would (the async writer's are daemons, settled)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken: nothing left to say there
            pass
    os._exit(code)
