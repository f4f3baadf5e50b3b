"""The one way slurmtrain runs an external program: an argument list (never a shell), a timeout.

It never raises: a missing program, a hang or a failure comes back as a `Cmd` whose `reason()` is
the line a user needs. Slurm commands (slurm_cmd.py), provenance (git) and the doctor use it.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class Cmd:
    """Outcome of one external command; rc 127 = not found, 124 = timed out."""

    argv: tuple[str, ...]
    rc: int
    out: str
    err: str
    timeout: float = 0.0

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def reason(self) -> str:
        """The last meaningful stderr (or stdout) line: Slurm puts the real cause last ('fatal: ...')."""
        last = ""
        for text in (self.err, self.out):
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            if lines:
                last = lines[-1]
                break
        if self.rc == 124:
            return (
                f"{last} (no answer within {self.timeout:g} s)"
                if last
                else f"no answer within {self.timeout:g} s"
            )
        return last or f"exit code {self.rc}"


def run_cmd(
    argv: Sequence[str],
    timeout: float,
    env: Optional[dict[str, str]] = None,
    cwd: Optional[str] = None,
) -> Cmd:
    """Run an argument list (never a shell) with a timeout; never raises."""
    full_env = {**os.environ, "LC_ALL": "C", **(env or {})}
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            errors="replace",
        )
    except FileNotFoundError:
        return Cmd(tuple(argv), 127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired as exc:  # keep what it said so far: often the real cause
        return Cmd(tuple(argv), 124, _text(exc.stdout), _text(exc.stderr), timeout)
    except OSError as err:
        return Cmd(tuple(argv), 126, "", f"{argv[0]}: {err}")
    return Cmd(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


def _text(data: "bytes | str | None") -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""
