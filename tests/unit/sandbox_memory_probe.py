"""Try to grow the host's shared memory from a sandboxed program; print what the host saw as JSON.

Run by ``tests/unit/test_sandbox_memory.py`` as ``python sandbox_memory_probe.py SCENARIO ATTACK``
(scenarios as in ``sandbox_probe.py``: ``as-is``, ``nobody``, ``no-sys-admin``). Each attack tries
to keep 2 GB alive; a thread samples ``Shmem`` of ``/proc/meminfo`` every 20 ms while it runs.
"""

import json
import sys
import threading
import time

from sandbox_probe import become_nobody, drop_sys_admin

from components.scoring.sandbox import SandboxUnavailable, run_program

MEMORY_MB = 256
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
    "sysv-shm": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True); libc.shmat.restype = ctypes.c_void_p\n"
                "for _ in range(20):\n    sid = libc.shmget(0, ctypes.c_size_t(100 << 20), 0o1600)\n"
                "    if sid < 0: raise OSError(ctypes.get_errno(), 'shmget')\n"
                "    p = libc.shmat(sid, None, 0); ctypes.memset(p, 1, 100 << 20); libc.shmdt(ctypes.c_void_p(p))\n",
}


def shmem_mb() -> float:
    with open("/proc/meminfo") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("Shmem:")) / 1024


def main() -> None:
    scenario, attack = sys.argv[1], sys.argv[2]
    if scenario == "no-sys-admin":
        drop_sys_admin()
    if scenario == "nobody":
        become_nobody()
    base = shmem_mb()
    peak, done = [base], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], shmem_mb())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        res = run_program(ATTACKS[attack] + _KEEP, timeout_s=30, memory_mb=MEMORY_MB)
        out = {"passed": res.passed, "reason": res.reason, "isolation": res.isolation,
               "stderr": res.stderr_tail[-400:]}
    except SandboxUnavailable as exc:
        out = {"skip": str(exc)[:300]}
    finally:
        done.set()
        sampler.join()
    out.update(grew_mb=round(peak[0] - base, 1), limit_mb=MEMORY_MB)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
