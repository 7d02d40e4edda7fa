"""The ``fit`` subprocesses a local ``compare`` has running, and how a stop reaches them.

Each fit runs in its own session (its own process group), so a terminal's Ctrl-C, or a closed terminal's SIGHUP,
reaches compare alone, and compare decides what the fits get: while it trains, a SIGTERM, Ctrl-C or SIGHUP sends
one SIGTERM to each running fit's group (every DDP rank of it), and each saves ``last.ckpt`` at the end of its
optimizer step and exits (resnorm_lm/train/preemption.py). No further run starts, and compare exits with 128 + the
signal once its fits have; the same command resumes the sweep. A second stop sends a second SIGTERM, on which the
fits exit at once. A signal that compare started with ignored (Ctrl-C in a shell's background job, SIGHUP under
``nohup``) stays ignored. SIGKILL cannot be passed on; on Linux the kernel passes it on instead: when compare dies
each fit gets ``LAUNCHER_GONE``, on which it stops the same way (``stop_with_compare``, which each fit calls as it
starts).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

from resnorm_lm.train.preemption import LAUNCHER_GONE

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
COMPARE_PID = "RESNORM_LM_COMPARE_PID"  # set for each fit compare starts: compare's pid
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class RunningFits:
    """Runs fit commands, each in its own session, and passes a stop on to those running (see the module)."""

    def __init__(self) -> None:
        self.stop_signal: int | None = None  # the first stop signal received
        self.stops = 0  # how many stop signals came; each fit is sent as many SIGTERMs, at most
        self.sent: dict[subprocess.Popen, int] = {}  # each running fit and the SIGTERMs sent to it

    def run(self, cmd: list[str], **popen: object) -> int | None:
        """Run ``cmd`` to its end and return its exit code; None, without starting it, after a stop."""
        if self.stops:
            return None
        env = {**(popen.pop("env", None) or os.environ), COMPARE_PID: str(os.getpid())}
        process = subprocess.Popen(cmd, start_new_session=True, env=env, **popen)
        self.sent[process] = 0
        try:
            self._pass_stops_on(process)  # a stop that came while it started
            return process.wait()
        finally:
            del self.sent[process]

    @contextlib.contextmanager
    def stoppable(self) -> Iterator[None]:
        """While the fits of a sweep train: the stop signals pass on to them. After the block, if a stop came,
        say so and exit with 128 + its signal."""
        handled = [s for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
        previous = {signum: signal.signal(signum, self._on_stop) for signum in handled}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if self.stop_signal is not None:
            with contextlib.suppress(OSError):
                print(
                    f"compare: stopped by {signal.Signals(self.stop_signal).name}; run the same command again "
                    "to resume the sweep",
                    file=sys.stderr,
                    flush=True,
                )
            raise SystemExit(128 + self.stop_signal)

    def _on_stop(self, signum: int, frame: object) -> None:
        self.stops += 1
        if self.stop_signal is None:
            self.stop_signal = signum
        name = signal.Signals(signum).name
        running = list(self.sent)
        if self.stops == 1:
            said = (
                f"\ncompare: {name}: {len(running)} run(s) in training save last.ckpt at the end of their step "
                f"and stop, and no run starts; {name} again stops them at once\n"
            )
        else:
            said = f"\ncompare: {name} again: the {len(running)} run(s) in training stop at once\n"
        with contextlib.suppress(OSError):  # a closed terminal's SIGHUP: nowhere to say it
            os.write(2, said.encode())  # not print: the signal may have come in the middle of one
        for process in running:
            self._pass_stops_on(process)

    def _pass_stops_on(self, process: subprocess.Popen) -> None:
        while self.sent.get(process, self.stops) < self.stops:
            self.sent[process] += 1
            with contextlib.suppress(ProcessLookupError):  # it has just ended
                os.killpg(process.pid, signal.SIGTERM)


def stop_with_compare() -> None:
    """In a fit that compare started: have the kernel send this process ``LAUNCHER_GONE`` when compare dies, however
    it dies (Linux; elsewhere nothing), so that a ``kill -9`` of compare stops its fits as a ``kill`` does. The
    variable is taken out of the environment, so that processes this fit starts (its DDP ranks) are left alone."""
    compare_pid = os.environ.pop(COMPARE_PID, None)
    if compare_pid is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, LAUNCHER_GONE) != 0:
        return  # not allowed here (a sandbox): the fit trains on if compare dies, as it would elsewhere
    if os.getppid() != int(compare_pid):  # compare died before the request took hold
        os.kill(os.getpid(), LAUNCHER_GONE)
