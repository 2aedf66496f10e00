"""The trusted judge of a HumanEval task (part of the sandbox script, not a library module).

:func:`judge_main` gets the task (``prompt``, ``test``, ``entry_point``, ``timeout_s``) after the
sandboxed side was forked off (see sandbox_boot.py). It never runs model-written code: it
executes the dataset's prompt and test, then calls ``check(candidate)`` where ``candidate`` is a
proxy that sends each call's arguments to the sandboxed program and returns its plain-data
answer (or raises the builtin exception it reported). So the verdict is decided here, out of the
program's reach: whatever the program does to its own interpreter, frames, fds or files, it can
only answer calls. A program that dies, hangs past the deadline or sends malformed data fails
the call with :class:`CandidateGone`, which ``except Exception`` in a test cannot swallow.

The verdict (one JSON object on the verdict fd): ``{"passed": true}``, or ``{"passed": false,
"why": ...}`` with ``why`` one of ``ended`` (the program exited or closed its pipe; the scorer
explains how from its exit status), ``timeout``, ``protocol: ...``, ``exception: Type: message``
(what ``check`` raised), or ``{"error": ...}`` when the task itself could not be judged.
"""

import builtins
import ctypes
import fcntl
import os
import sys
import time

if __name__ != "__main__":  # imported by tests or linters; as a script, wire.py's text precedes this
    from components.scoring.wire import WireError, decode, encode, read_frame, write_frame  # noqa: F401

import json  # noqa: E402


class CandidateGone(BaseException):  # noqa: N818 - not an Exception on purpose (tests catch Exception)
    """The sandboxed program can no longer answer (exited, timed out, broke the protocol)."""

    def __init__(self, why):
        super().__init__(why)
        self.why = why


class _Proxy:
    """Stands for the candidate function inside ``check``."""

    def __init__(self, req, rep, deadline):
        self._req, self._rep, self._deadline, self._next = req, rep, deadline, 0

    def __call__(self, *args, **kwargs):
        self._next += 1
        call_id = self._next
        try:
            write_frame(self._req, {"id": call_id, "args": encode(list(args)), "kwargs": encode(kwargs)},
                        self._deadline)
            reply = read_frame(self._rep, self._deadline)
        except TimeoutError:
            raise CandidateGone("timeout") from None
        except (BrokenPipeError, ConnectionError):
            raise CandidateGone("ended") from None
        except WireError as exc:
            raise CandidateGone(f"protocol: {exc}") from None
        if reply is None:
            raise CandidateGone("ended")
        if type(reply) is not dict or reply.get("id") != call_id:
            raise CandidateGone("protocol: reply does not answer the call")
        if "raise" in reply:
            name, message = _pair(reply["raise"])
            cls = getattr(builtins, name, None)
            if isinstance(cls, type) and issubclass(cls, Exception) and cls.__module__ == "builtins":
                raise cls(message)
            raise CandidateGone(f"exception: {name}: {message}")
        try:
            return decode(reply.get("value"))
        except WireError as exc:
            raise CandidateGone(f"protocol: {exc}") from None


def _pair(value):
    if type(value) is list and len(value) == 2 and all(type(v) is str for v in value):
        return value[0][:100], value[1][:500]
    raise CandidateGone("protocol: malformed exception")


def judge(task, req, rep):
    deadline = time.monotonic() + float(task["timeout_s"])
    try:
        ready = read_frame(rep, deadline)
    except TimeoutError:
        return {"passed": False, "why": "timeout"}
    except WireError as exc:
        return {"passed": False, "why": f"protocol: {exc}"}
    if ready is None:
        return {"passed": False, "why": "ended"}
    if ready != {"ready": True}:
        return {"passed": False, "why": "protocol: expected the ready message"}
    scope = {"__name__": "__judge__"}
    try:
        # the prompt supplies helpers a test may call; a bare "def f(x):" stub needs a body to compile
        for head in (task["prompt"], task["prompt"] + "\n    pass\n", ""):
            try:
                code = compile(head + "\n" + task["test"], "task.py", "exec")
                break
            except SyntaxError:
                if not head:
                    raise
        exec(code, scope)
        check = scope["check"]
    except BaseException as exc:  # noqa: BLE001 - the dataset's own code is broken
        return {"error": f"the task's prompt or test failed: {type(exc).__name__}: {exc}"[:300]}
    proxy = _Proxy(req, rep, deadline)
    scope[task["entry_point"]] = proxy  # tests may call the function by name, as in the one-file harness
    try:
        check(proxy)
    except CandidateGone as exc:
        return {"passed": False, "why": exc.why}
    except BaseException as exc:  # noqa: BLE001 - the check failed: AssertionError or what the call raised
        return {"passed": False, "why": f"exception: {type(exc).__name__}: {exc}"[:300]}
    return {"passed": True}


def judge_main(task, req, rep, verdict_fd):
    """Judge ``task`` against the program behind the ``req``/``rep`` pipes; write the verdict, exit."""
    try:
        try:  # not dumpable: a process of the same uid cannot ptrace this one or read its memory
            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
        except (OSError, AttributeError):
            pass
        sys.set_int_max_str_digits(0)
        for fd in (req, rep):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # the test's prints must not mix with the program's output
        os.dup2(devnull, 2)
        verdict = judge(task, req, rep)
    except BaseException as exc:  # noqa: BLE001 - a judge failure is an error, never a pass
        verdict = {"error": f"judge failed: {type(exc).__name__}: {exc}"[:300]}
    os.write(verdict_fd, json.dumps(verdict).encode())
    os._exit(0)
