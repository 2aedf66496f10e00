"""Try to grow the host's shared memory from a sandboxed program; print what the host saw as JSON.

Run by ``tests/integration/test_sandbox_memory.py`` as ``python sandbox_memory_probe.py SCENARIO ATTACK``
(scenarios as in ``sandbox_probe.py``: ``as-is``, ``nobody``, ``no-sys-admin``). Each attack tries
to keep 2 GB alive; a thread samples every 20 ms while it runs, from outside the sandbox: the
host's ``Shmem`` (``/proc/meminfo``: tmpfs, memfd, SysV) and the anonymous memory (``RssAnon``)
summed over every process descended from this one (the sandbox's outer process, its init, the
program and whatever the program started). ``total_mb`` is the peak of the two together.
"""

import json
import os
import sys
import threading
import time

from sandbox_probe import become_nobody, drop_sys_admin

from components.scoring.sandbox import SandboxLimits, SandboxUnavailable, memory_bound_mb, run_program

MEMORY_MB = 256
LIMITS = SandboxLimits(memory_mb=MEMORY_MB)
_KEEP = "import time; time.sleep(3)\n"  # hold what was allocated while the host samples
ATTACKS = {
    # 256 memfd files of 8 MB (under RLIMIT_FSIZE each), never mapped
    "memfd": "import os\nfds = []\nfor i in range(256):\n"
             "    fds.append(os.memfd_create(f'm{i}')); os.write(fds[-1], b'x' * (8 << 20))\n",
    # one memfd grown by ftruncate, written through a mapping, then unmapped (the fd keeps it)
    "memfd-mmap": "import mmap, os\nfd = os.memfd_create('m'); os.ftruncate(fd, 2 << 30)\n"
                  "m = mmap.mmap(fd, 2 << 30)\nfor off in range(0, 2 << 30, 4096): m[off] = 1\nm.close()\n",
    # forked children each fill memfds and wait
    "fork-memfd": "import os\nfor _ in range(16):\n    if os.fork() == 0:\n        fds = []\n"
                  "        for i in range(16): fds.append(os.memfd_create('m')); os.write(fds[-1], b'x' * (8 << 20))\n"
                  "        import time; time.sleep(3); os._exit(0)\n"
                  "assert all(os.wait()[1] == 0 for _ in range(16)), 'a child failed'\n",
    # POSIX shared memory: files of 8 MB in /dev/shm
    "dev-shm": "for i in range(256):\n    open(f'/dev/shm/f{i}', 'wb').write(b'x' * (8 << 20))\n",
    # one file per 4 KB page: inodes and pages
    "many-files": "import os\nos.mkdir('/tmp/d')\nfor i in range(500_000):\n"
                  "    with open(f'/tmp/d/{i}', 'wb') as fh: fh.write(b'x' * 4096)\n",
    # a sparse 2 GB file, then filled
    "sparse": "import os\nfd = os.open('/tmp/s', os.O_RDWR | os.O_CREAT); os.ftruncate(fd, 2 << 30)\n"
              "for off in range(0, 2 << 30, 1 << 20): os.pwrite(fd, b'x' * (1 << 20), off)\n",
    # SysV shared memory: segments outlive the mapping
    # forked children each keep 200 MB of anonymous memory (RLIMIT_AS is per process)
    "fork-anon": "import os, time\nfor _ in range(8):\n    if os.fork() == 0:\n"
                 "        x = bytearray(200 << 20); time.sleep(3); os._exit(0)\n"
                 "assert all(os.wait()[1] == 0 for _ in range(8)), 'a child failed'\n",
    # subprocesses (fork + exec) each keeping 200 MB
    "subprocess-anon": "import shutil, subprocess, sys\npy = shutil.which('python3') or sys.executable\n"
                       "ps = [subprocess.Popen([py, '-c', "
                       "'import time; x = bytearray(200 << 20); time.sleep(3)']) for _ in range(8)]\n"
                       "assert all(p.wait() == 0 for p in ps)\n",
    # threads share one address space: 8 x 100 MB cannot all be had under 256 MB
    "threads-anon": "import threading, time\nkept, errors = [], []\n"
                    "def grab():\n    try:\n        kept.append(bytearray(100 << 20)); time.sleep(3)\n"
                    "    except MemoryError as e:\n        errors.append(e)\n"
                    "ts = [threading.Thread(target=grab) for _ in range(8)]\n[t.start() for t in ts]\n"
                    "[t.join() for t in ts]\nassert not errors, f'{len(errors)} threads got no memory'\n",
    # everything at once: the three scratch tmpfs full, the address space full, then children
    "everything": "import os, time\nkept = []\nfor d in ('/tmp', '/var/tmp', '/dev/shm'):\n"
                  "    for i in range(64):\n        try:\n"
                  "            open(f'{d}/f{i}', 'wb').write(b'x' * (8 << 20))\n"
                  "        except OSError:\n            break\n"
                  "for size in (64, 16, 4, 1):\n    while True:\n        try:\n"
                  "            kept.append(bytearray(size << 20))\n        except MemoryError:\n            break\n"
                  "for _ in range(8):\n    if os.fork() == 0:\n"
                  "        x = bytearray(200 << 20); time.sleep(3); os._exit(0)\n"
                  "time.sleep(3)\n",
    "sysv-shm": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True); libc.shmat.restype = ctypes.c_void_p\n"
                "for _ in range(20):\n    sid = libc.shmget(0, ctypes.c_size_t(100 << 20), 0o1600)\n"
                "    if sid < 0: raise OSError(ctypes.get_errno(), 'shmget')\n"
                "    p = libc.shmat(sid, None, 0); ctypes.memset(p, 1, 100 << 20); libc.shmdt(ctypes.c_void_p(p))\n",
}


def shmem_mb() -> float:
    with open("/proc/meminfo") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("Shmem:")) / 1024


def descendants_anon_mb(top: int) -> float:
    """``RssAnon`` summed over every live process below ``top`` (racy /proc scan: a process may end)."""
    parent, anon = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue
        parent[int(entry)] = int(fields.get("PPid", "0"))
        anon[int(entry)] = int(fields.get("RssAnon", "0 kB").split()[0])
    total = 0
    for pid, kb in anon.items():
        p = parent.get(pid, 0)
        while p and p != top:
            p = parent.get(p, 0)
        total += kb if p == top else 0
    return total / 1024


def main() -> None:
    scenario, attack = sys.argv[1], sys.argv[2]
    if scenario == "no-sys-admin":
        drop_sys_admin()
    if scenario == "nobody":
        become_nobody()
    base = shmem_mb()
    peak, total, done = [base], [0.0], threading.Event()
    me = os.getpid()

    def sample() -> None:
        while not done.is_set():
            shmem = shmem_mb()
            peak[0] = max(peak[0], shmem)
            total[0] = max(total[0], shmem - base + descendants_anon_mb(me))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        res = run_program(ATTACKS[attack] + _KEEP, timeout_s=30, limits=LIMITS)
        out = {"passed": res.passed, "reason": res.reason, "isolation": res.isolation,
               "stderr": res.stderr_tail[-400:]}
    except SandboxUnavailable as exc:
        out = {"skip": str(exc)[:300]}
    finally:
        done.set()
        sampler.join()
    out.update(grew_mb=round(peak[0] - base, 1), limit_mb=MEMORY_MB, total_mb=round(total[0], 1),
               bound_mb=memory_bound_mb(LIMITS))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
