"""A program that does not solve its task is never scored correct, whatever it does at run time.

The judge runs ``check`` in its own process; these completions attack everything within reach of
the program: its interpreter, frames, modules, builtins, file descriptors, files and processes.
"""

import math
from textwrap import dedent, indent

import pytest

from components.scoring.sandbox import CodeTask, SandboxLimits, run_task
from components.scoring.wire import WireError, decode, encode

PROMPT = 'def add(a, b):\n    """Return a + b."""\n'
TEST = ("def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
        "    assert candidate(10, 20) == 30\n")
WRONG = "    return 0\n"

ATTACKS = {
    "sys.exit(0) before the check": WRONG + "import sys\nsys.exit(0)\n",
    "os._exit(0) inside the call": "    import os\n    os._exit(0)\n",
    "os._exit(0) at import": WRONG + "import os\nos._exit(0)\n",
    "patched builtins and AssertionError": WRONG + (
        "import builtins\nclass _Never(Exception):\n    pass\nbuiltins.AssertionError = _Never\n"
        "builtins.Exception = _Never\nbuiltins.BaseException = _Never\n"),
    "object whose __eq__ is always True": (
        "    class Yes:\n        def __eq__(self, other):\n            return True\n"
        "        __ne__ = lambda self, other: False\n        __hash__ = object.__hash__\n    return Yes()\n"),
    "int subclass whose __eq__ is always True": (
        "    class Yes(int):\n        def __eq__(self, other):\n            return True\n    return Yes(0)\n"),
    "fake pass markers on stdout, stderr and every fd": WRONG + (
        "import os, sys, json\nfor text in ('passed', 'PASSED', '{\"passed\": true}', 'agent-gspo ok'):\n"
        "    print(text, flush=True)\n    print(text, file=sys.stderr, flush=True)\n"
        "frame = json.dumps({'passed': True}).encode()\nfor fd in range(3, 256):\n"
        "    for data in (frame, len(frame).to_bytes(4, 'big') + frame, b'{\"ready\": true}'):\n"
        "        try:\n            os.write(fd, data)\n        except OSError:\n            pass\n"),
    "forged reply frames for calls not yet made": WRONG + (
        "import os, json\nfor fd in range(3, 64):\n    for i in range(1, 10):\n"
        "        body = json.dumps({'id': i, 'value': True}).encode()\n"
        "        try:\n            os.write(fd, len(body).to_bytes(4, 'big') + body)\n"
        "        except OSError:\n            pass\n"),
    "frames, gc and modules searched for the check": WRONG + dedent("""
        import gc, sys
        found = [o for o in gc.get_objects() if callable(o) and getattr(o, "__name__", "") == "check"]
        f = sys._getframe()
        while f is not None:
            found.append(f.f_globals.get("check"))
            f = f.f_back
        for fn in filter(None, found):
            try:
                fn.__code__ = (lambda c: None).__code__
            except Exception:
                pass
        """),
    "kill the parent, every process and the process group": WRONG + (
        "import os, signal\nfor target in (os.getppid(), 1, -1):\n    try:\n        os.kill(target, signal.SIGKILL)\n"
        "    except OSError:\n        pass\ntry:\n    os.killpg(0, signal.SIGKILL)\nexcept OSError:\n    pass\n"),
    "fork: the child answers while the parent exits": (
        "    return 0\nimport os\nif os.fork() != 0:\n    os._exit(0)\n"),
    "raising SystemExit inside the call": "    raise SystemExit(0)\n",
    "raising an exception the test might catch": "    raise KeyboardInterrupt\n",
    "huge reply": "    return 'x' * (80 << 20)\n",
    "deeply nested reply": "    v = 0\n    for _ in range(100000):\n        v = [v]\n    return v\n",
    "generator instead of a value": "    yield a + b\n",
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_scored_incorrect(name: str) -> None:
    res = run_task(CodeTask(PROMPT, ATTACKS[name], TEST, "add"), timeout_s=5)
    assert not res.passed, f"{name}: scored correct ({res.reason})"
    assert res.reason != "passed"


def test_right_answers_still_pass_and_helpers_come_from_the_prompt() -> None:
    assert run_task(CodeTask(PROMPT, "    return a + b\n", TEST, "add"), timeout_s=5).passed
    # the test calls a helper of the prompt: redefining it in the completion must not change the check
    prompt = "def ref(a, b):\n    return a + b\n\n" + PROMPT
    test = "def check(candidate):\n    assert candidate(4, 5) == ref(4, 5)\n"
    cheat = "    return 0\ndef ref(a, b):\n    return 0\n"
    assert not run_task(CodeTask(prompt, cheat, test, "add"), timeout_s=5).passed
    # and a test that calls the function by its own name reaches the candidate, as in one-file harnesses
    by_name = "def check(candidate):\n    assert add(1, 1) == 2\n"
    assert run_task(CodeTask(PROMPT, "    return a + b\n", by_name, "add"), timeout_s=5).passed
    assert not run_task(CodeTask(PROMPT, WRONG, by_name, "add"), timeout_s=5).passed


def test_the_test_is_never_in_the_programs_memory() -> None:
    """The sandbox side forks before the task is read: the expected answer exists only in the judge."""
    secret = "expected-7f3a1c9e2b"
    test = f"def check(candidate):\n    assert candidate(0, 0) == {secret!r}\n"
    steal = indent(dedent("""
        import ctypes, gc, re
        for o in gc.get_objects():
            if isinstance(o, str) and (m := re.search(r"expected-[0-9a-f]{10}", o)):
                return m.group(0)
        ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable again, so /proc/self/mem opens
        with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb") as mem:
            for line in maps:
                addr, perms = line.split()[:2]
                if not perms.startswith("r"):
                    continue
                lo, hi = (int(x, 16) for x in addr.split("-"))
                try:
                    mem.seek(lo)
                    data = mem.read(hi - lo)
                except (OSError, ValueError, OverflowError):
                    continue
                if m := re.search(rb"expected-[0-9a-f]{10}", data):
                    return m.group(0).decode()
        return "not found"
        """), "    ")
    res = run_task(CodeTask(PROMPT, steal, test, "add"), timeout_s=20, limits=SandboxLimits(memory_mb=2048))
    assert not res.passed, "the program found the expected answer in its own memory"
    assert res.reason.startswith("exception: AssertionError"), res
    # control: the same search finds the answer when it is in the program's memory (as bytes only)
    planted = steal + "_bytes = bytearray(b'expected-') + bytearray(b'7f3a1c9e2b')\n"
    assert run_task(CodeTask(PROMPT, planted, test, "add"), timeout_s=20, limits=SandboxLimits(memory_mb=2048)).passed


def test_exceptions_come_back_as_builtin_types() -> None:
    test = ("def check(candidate):\n    try:\n        candidate(1, 0)\n    except ZeroDivisionError:\n        pass\n"
            "    else:\n        assert False, 'expected ZeroDivisionError'\n")
    assert run_task(CodeTask(PROMPT, "    return a / b\n", test, "add"), timeout_s=5).passed
    res = run_task(CodeTask(PROMPT, "    raise ValueError('nope')\n", TEST, "add"), timeout_s=5)
    assert not res.passed and res.reason == "exception: ValueError: nope"


def test_wire_round_trip_and_strict_decoding() -> None:
    values = [None, True, False, 0, -7, 10**400, 1.5, math.inf, "héllo", [1, [2, (3,)]], (1, "a", None),
              {1, 2}, frozenset({"x"}), {"k": [1], 2: (3,)}, b"\x00\xff", 1 + 2j, []]
    for v in values:
        assert decode(encode(v)) == v and type(decode(encode(v))) is type(v)
    assert math.isnan(decode(encode(float("nan"))))
    for bad in ({"x": 1}, {"t": 1}, {"d": [[[1], 2]]}, {"s": [[1]]}, {"b": "zz"}, {"t": [], "s": []}):
        with pytest.raises(WireError):
            decode(bad)
    with pytest.raises(WireError):
        encode(object())
    nested: list = []
    for _ in range(500):
        nested = [nested]
    with pytest.raises(WireError):
        encode(nested)
