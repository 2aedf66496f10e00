"""``torchrun`` with a quiet interrupt: the same launcher, without the traceback on Ctrl-C or SIGTERM.

Why a wrapper: torchrun turns SIGINT / SIGTERM into a ``SignalException`` that it re-raises after
stopping its workers, so every interrupted launch ended in a ~60-line traceback, and on Ctrl-C in
two chained ones: the terminal's SIGINT started the shutdown, then the SIGTERM that
``agent-gspo train`` sends its child (:func:`components.runtime.launch.stop_child`) raised again inside
it, cutting the workers' shutdown short. Here the first signal starts the shutdown and later ones
let it finish; the exception becomes exit code 128 + signal, and the parent prints its one line
(README, "Ctrl-C exits 130"). A worker that fails is reported by torchrun as before.

Run as ``python -m components.runtime.torchrun_entry <torchrun arguments>``
(:func:`components.runtime.launch.launcher_command` does).
"""

from __future__ import annotations

import sys
from types import FrameType


def handle_first_signal_only() -> bool:
    """Make torchrun's signal handler act on the first death signal only; False when this torch
    has no such handler (the launcher then behaves as plain torchrun)."""
    from torch.distributed.elastic.multiprocessing import api

    original = getattr(api, "_terminate_process_handler", None)
    if original is None or getattr(original, "_first_only", False):
        return original is not None
    seen: list[int] = []

    def first_only(signum: int, frame: FrameType | None) -> None:
        if seen:  # already shutting the workers down: let that finish
            return
        seen.append(signum)
        original(signum, frame)

    first_only._first_only = True  # type: ignore[attr-defined]
    api._terminate_process_handler = first_only  # read when torchrun registers its handlers
    return True


def main() -> int:
    """torchrun's ``main`` on ``sys.argv[1:]``; 128 + signal when a death signal stopped it."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    handle_first_signal_only()
    try:
        torchrun()
    except SignalException as exc:
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
