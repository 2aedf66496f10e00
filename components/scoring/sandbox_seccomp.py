"""The sandboxed program's seccomp filter (part of the sandbox script, not a library module).

Part of the same script as sandbox_boot.py (``python -I -S -c <wire.py + sandbox_judge.py +
sandbox_fs.py + this text + sandbox_boot.py>``), which installs it last before the program runs.

Why a hand-written BPF program through ``prctl``: the script runs with ``python -I -S`` and only
the standard library (no site-packages, which the sandbox hides anyway), and the PyPI bindings
of libseccomp (``pyseccomp``, ``seccomp``) need the C library installed on the host besides. The
filter is short: syscall numbers of x86_64 and aarch64 only, every other ABI refused.
"""

import ctypes
import os

if __name__ != "__main__":  # imported by tests or linters; as a script, sandbox_fs.py's text precedes this
    from components.scoring.sandbox_fs import _LIBC, _call

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
CLONE_THREAD = 0x00010000
_RET_ALLOW, _RET_EPERM, _RET_ENOSYS = 0x7FFF0000, 0x00050001, 0x00050026
SECCOMP_ARCH = {
    "x86_64": {"audit": 0xC000003E, "socket": 41, "clone": 56, "clone3": 435,
               "refused": (319, 447, 29, 68, 57, 58)},
    "aarch64": {"audit": 0xC00000B7, "socket": 198, "clone": 220, "clone3": 435,
                "refused": (279, 447, 194, 186)},
}
"""machine -> AUDIT_ARCH of the native ABI and syscall numbers: ``refused`` outright are
memfd_create, memfd_secret, shmget, msgget and (x86_64 only: aarch64 has neither) fork, vfork."""


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program(machine):
    """The filter as (code, jt, jf, k) tuples (see :func:`install_seccomp` for what it refuses)."""
    arch = SECCOMP_ARCH[machine]
    prog = [
        (0x20, 0, 0, 4), (0x15, 1, 0, arch["audit"]), (0x06, 0, 0, _RET_EPERM),  # another ABI: refuse all
        (0x20, 0, 0, 0), (0x35, 0, 1, 0x40000000), (0x06, 0, 0, _RET_EPERM),  # x32 syscall numbers
    ]
    for nr in arch["refused"]:
        prog += [(0x15, 0, 1, nr), (0x06, 0, 0, _RET_EPERM)]
    prog += [
        # clone3 passes its flags in memory a filter cannot read: ENOSYS, so glibc falls back to clone
        (0x15, 0, 1, arch["clone3"]), (0x06, 0, 0, _RET_ENOSYS),
        # clone: only a thread (CLONE_THREAD, which the kernel accepts only with CLONE_VM)
        (0x15, 0, 3, arch["clone"]), (0x20, 0, 0, 16), (0x45, 1, 0, CLONE_THREAD), (0x06, 0, 0, _RET_EPERM),
        (0x20, 0, 0, 0),  # the syscall number again
        (0x15, 0, 3, arch["socket"]), (0x20, 0, 0, 16), (0x15, 0, 1, 1), (0x06, 0, 0, _RET_EPERM),  # AF_UNIX
        (0x06, 0, 0, _RET_ALLOW),
    ]
    return prog


def install_seccomp():
    """Make these fail with EPERM (``PermissionError`` in Python), for this process and any image
    it ``exec``s:

    * every syscall of another ABI (i386, x32), and ``socket(AF_UNIX, ...)``: unix sockets on the
      file system are reachable from any network namespace;
    * **new processes**: ``fork``, ``vfork``, and ``clone`` without ``CLONE_THREAD`` (``clone3``
      answers ENOSYS, so the C library falls back to ``clone``). RLIMIT_AS bounds one address
      space, and threads share it, but each new process has its own: 4 children x 200 MB ran
      under a 256 MB limit before. So the program's anonymous memory in all is at most
      ``memory_mb``, as root, as root without CAP_SYS_ADMIN and as any uid (RLIMIT_NPROC, the
      other way to stop forks, does not hold for root or in a user namespace's root);
    * memory that no rlimit bounds: ``memfd_create``/``memfd_secret`` files live on the kernel's
      internal shm mount, not on the sandbox's size-limited tmpfs (RLIMIT_FSIZE caps each one,
      but a process may hold ``NOFILE`` of them: 512 MB under a 256 MB limit, measured); SysV
      shared memory (``shmget``) and message queues (``msgget``) outlive every fd and mapping
      until the IPC namespace dies (600 MB of segments under a 256 MB limit, measured).
    """
    prog = seccomp_program(os.uname().machine)
    filters = (_SockFilter * len(prog))(*[_SockFilter(*f) for f in prog])
    fprog = _SockFprog(len(prog), filters)
    _call(_LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "installing the seccomp filter")
