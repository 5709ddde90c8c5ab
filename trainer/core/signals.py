"""SIGTERM and SIGINT during fit: note them, and let the loop stop at the next step boundary."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any


class StopSignals:
    """While active, SIGTERM/SIGINT set ``received`` instead of killing the process.

    A second Ctrl-C restores the default behaviour and interrupts at once. One press can
    reach a worker twice (from the terminal, and forwarded by its launcher, which shares
    the terminal's process group), so a SIGINT within ``SIGINT_ECHO_S`` of the first counts
    as the same press. Handlers can only be installed from the main thread; elsewhere this
    does nothing.

    A SIGINT that is ignored when fit starts (``SIG_IGN``: a job that a script or another
    non-interactive shell started in the background with ``&``) stays ignored, as Python
    itself leaves it at startup: a Ctrl-C meant for the foreground must not stop this job.
    SIGTERM is always caught, and a SIGTERM handler installed before (the user's, a cluster
    library's) is called as well, as Lightning's signal handling does.
    """

    SIGINT_ECHO_S = 1.0

    def __init__(self) -> None:
        self.received: int | None = None
        self._first_sigint: float | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        self.received = None
        self._first_sigint = None
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                if sig == signal.SIGINT and signal.getsignal(sig) is signal.SIG_IGN:
                    continue
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            now = time.monotonic()
            if self._first_sigint is None:
                self._first_sigint = now
            elif now - self._first_sigint > self.SIGINT_ECHO_S:
                signal.signal(signal.SIGINT, signal.default_int_handler)
                raise KeyboardInterrupt
        if self.received is None:  # the first signal names the stop
            self.received = signum
        previous = self._previous.get(signum)
        if signum == signal.SIGTERM and callable(previous):  # Lightning's: a SIGTERM handler of the user's runs too
            previous(signum, frame)

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class Interrupted(RuntimeError):
    """fit stopped because of SIGTERM or SIGINT, after writing ``last.ckpt`` when checkpointing is on."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
