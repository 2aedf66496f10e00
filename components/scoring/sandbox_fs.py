"""The sandbox's file system: the read-only root that :mod:`components.scoring.sandbox_boot` builds.

Part of the same script as sandbox_boot.py (``python -I -S -c <wire.py + sandbox_judge.py + this
text + sandbox_boot.py>``), kept apart so each half stays readable: this half decides what of the
host the program may see and mounts exactly that (see sandbox_boot's docstring for the allow-list:
system folders, Python's standard library, a few ``/dev`` nodes, a new ``proc``, fresh scratch
``tmpfs``; every ``site-packages`` folder and the scorer's hidden paths covered). Every mount step
is checked; a failure raises :class:`SetupError` and the program never runs. Only the standard
library is used: the script runs with ``-I -S``.
"""

import ctypes
import glob
import os
import stat
import sys

_STDLIB = list(sys.path)
"""What ``python -I -S`` searches: the standard library (zip, folder, lib-dynload), nothing else."""

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE = 1024, 2048, 4096, 16384, 1 << 18
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
MNT_DETACH = 2
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
"""machine -> number of the pivot_root syscall (glibc has no wrapper)"""
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long
_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm", "/run")
"""Fresh tmpfs on each: world-writable scratch and the usual place of unix sockets (docker,
dbus, postgres) -- filesystem sockets ignore the network namespace and read-only mounts."""
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
"""Shown to the program (read-only), with Python's own library folders; nothing else of the host."""
_DEVICES = ("null", "zero", "full", "random", "urandom")


class SetupError(Exception):
    """An isolation step failed: the program must not run."""


def _call(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what} failed: {os.strerror(err)} (errno {err})")


def _stdlib():
    """The standard library's folders (old path -> canonical path); refuses when unreadable."""
    out = {}
    for p in _STDLIB:
        try:
            os.stat(p)
        except FileNotFoundError:  # e.g. pythonXY.zip, usually absent
            continue
        except OSError as exc:
            raise SetupError(f"Python's standard library {p} cannot be read by uid {os.geteuid()}: "
                             f"{exc.strerror}") from None
        out[p.rstrip("/")] = os.path.realpath(p)
    return out


def _unescape(field):
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _mounts():
    """(mount point, per-mount flags to keep) from /proc/self/mountinfo, in mount order."""
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            opts = set(fields[5].split(","))
            keep = (MS_NOSUID if "nosuid" in opts else 0) | (MS_NODEV if "nodev" in opts else 0)
            keep |= MS_NOEXEC if "noexec" in opts else 0
            keep |= MS_NODIRATIME if "nodiratime" in opts else 0
            if "noatime" in opts:
                keep |= MS_NOATIME
            elif "relatime" in opts:
                keep |= MS_RELATIME
            else:
                keep |= MS_STRICTATIME
            out.append((_unescape(fields[4]), keep))
    return out


def _under(path, top):
    return path == top or path.startswith(top.rstrip("/") + "/")


def _visible(stdlib):
    """(symlinks to recreate, canonical folders to show): the system folders, and Python's
    standard library and lib folder (the shared libraries its extension modules load)."""
    links, found = [], list(stdlib.values())
    for p in _SYSTEM:
        if os.path.islink(p):
            links.append((p, os.readlink(p)))
        elif os.path.isdir(p):
            found.append(p)
    for prefix in {sys.base_prefix, sys.base_exec_prefix}:
        if os.path.isdir(os.path.join(prefix, "lib")):
            found.append(os.path.join(prefix, "lib"))
    roots = []
    for p in sorted({os.path.realpath(p) for p in found}):  # an ancestor sorts before its descendants
        if p != "/" and not any(_under(p, r) for r in roots):
            roots.append(p)
    for r in roots:
        if any(_under(r, s) for s in (*_SCRATCH, "/dev", "/proc")):
            raise SetupError(f"{r} (Python or a system folder) lies in {r.split('/')[1]!r}, which the sandbox "
                             "replaces: install Python elsewhere")
    return links, roots


def _hidden(cfg, roots, stdlib):
    """Canonical paths inside the shown folders to cover: every site-/dist-packages folder
    (installed packages and their data) and what the scorer names (``cfg["hide"]``), except
    the standard library's folders and their ancestors."""
    pats = []
    for top in {*roots, sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}:
        top = glob.escape(top.rstrip("/"))
        pats += [f"{top}/python*/*-packages", f"{top}/lib*/python*/*-packages",
                 f"{top}/local/lib*/python*/*-packages"]
    out = set()
    for p in [*cfg.get("hide", []), *(m for pat in pats for m in glob.glob(pat))]:
        real = os.path.realpath(p)
        if any(_under(r, real) for r in (*roots, *stdlib.values())):
            continue  # Python's own folders, or above a shown folder: there only shown folders exist
        if any(_under(real, r) for r in roots):
            out.add(real)
    return sorted(out)


def _show(src, dst, mounts, recursive):
    """Bind ``src`` (with its submounts) on ``dst`` and make each read-only, keeping the
    per-mount flags a user namespace may not drop."""
    _call(_LIBC.mount(src.encode(), dst.encode(), None, MS_BIND | (MS_REC if recursive else 0), None),
          f"showing {src} in the sandbox")
    keep = 0
    for point, flags in mounts:  # the innermost mount that holds src
        if _under(src, point):
            keep = flags
    inner = [(p, k) for p, k in mounts if recursive and p != src and _under(p, src)]
    for point, flags in [(src, keep), *inner]:
        target = dst + point[len(src):]
        if _LIBC.mount(None, target.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags, None) != 0:
            err = ctypes.get_errno()
            if err in (2, 13) and point != src:  # ENOENT / EACCES: over-mounted or not reachable by this uid
                continue
            raise SetupError(f"remounting {point} read-only failed: {os.strerror(err)} (errno {err})")


def _touch(path):
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444))


def _hide(path, empty):
    """An empty read-only tmpfs over a folder, an empty read-only file over anything else."""
    try:
        st = os.lstat(path)
    except OSError:  # absent, or out of this uid's reach (and so of the program's)
        return
    what = f"hiding {path}"
    if stat.S_ISDIR(st.st_mode):
        _call(_LIBC.mount(b"hidden", path.encode(), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                          b"size=4k,nr_inodes=16,mode=555"), what)
    elif not stat.S_ISLNK(st.st_mode):
        _call(_LIBC.mount(empty.encode(), path.encode(), None, MS_BIND, None), what)
        _call(_LIBC.mount(None, path.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
                          | MS_NOEXEC, None), what)


def _build_root(cfg):
    """A new read-only root holding only what the program may see (see the module docstring);
    ``pivot_root`` into it and detach the host's file system. Returns the stdlib's folders."""
    machine = os.uname().machine
    if machine not in _PIVOT_ROOT:
        raise SetupError(f"no pivot_root syscall number for machine {machine} (x86_64, aarch64 only)")
    _call(_LIBC.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making mounts private")
    os.umask(0o022)
    mounts = _mounts()
    stdlib = _stdlib()
    links, roots = _visible(stdlib)
    hidden = _hidden(cfg, roots, stdlib)
    new = cfg["newroot"]
    _call(_LIBC.mount(b"tmpfs", new.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,nr_inodes=4096,mode=755"),
          "tmpfs for the sandbox's root")
    for path, target in links:
        os.symlink(target, new + path)
    for root in roots:
        os.makedirs(new + root, 0o755, exist_ok=True)
        _show(root, new + root, mounts, True)
    for folder in ("/dev", "/proc", *_SCRATCH):
        os.makedirs(new + folder, 0o755, exist_ok=True)
    for name in _DEVICES:
        if os.path.exists(f"/dev/{name}"):
            _touch(f"{new}/dev/{name}")
            _show(f"/dev/{name}", f"{new}/dev/{name}", mounts, False)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{new}/dev/{name}")
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if _LIBC.mount(b"proc", f"{new}/proc".encode(), b"proc", flags, None) != 0:  # e.g. a container's masked /proc
        _call(_LIBC.mount(b"tmpfs", f"{new}/proc".encode(), b"tmpfs", flags | MS_RDONLY, b"size=4k,mode=555"),
              "hiding /proc (a new proc mount was refused)")
    empty = "/.agent-gspo-empty"
    _touch(new + empty)
    os.chdir(new)
    _call(_LIBC.syscall(_PIVOT_ROOT[machine], b".", b"."), "pivot_root into the sandbox's root")
    _call(_LIBC.umount2(b".", MNT_DETACH), "detaching the host's file system")
    os.chdir("/")
    for path in hidden:
        _hide(path, empty)
    os.unlink(empty)
    _call(_LIBC.mount(None, b"/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None),
          "making the sandbox's root read-only")
    size = f"size={cfg['tmpfs_mb']}m,nr_inodes=4096"
    for point in _SCRATCH:
        data = f"{size},mode={'755' if point == '/run' else '1777'}".encode()
        flags = MS_NOSUID | MS_NODEV | (MS_RDONLY if point == "/run" else 0)
        _call(_LIBC.mount(b"tmpfs", point.encode(), b"tmpfs", flags, data), f"tmpfs on {point}")
    return stdlib
