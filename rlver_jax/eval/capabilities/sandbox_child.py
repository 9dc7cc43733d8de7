"""The child process of rlver_jax.eval.capabilities.sandbox: runs as `python -I sandbox_child.py`
(no project imports), reads one task as JSON from stdin, confines itself, grades the program with
LiveCodeBench's `run_test`, and writes the result as the last line of its original stdout.

Confinement, in order, before any generated code runs: a network namespace of its own with no
interfaces (unshare(CLONE_NEWNET) as root, with CLONE_NEWUSER otherwise, where permitted);
resource limits (address space, CPU seconds, file size, open files, processes, no core dumps);
as root, the uid and gid of `nobody`, so the file system's permissions apply (when nobody can
read the Python installation); Landlock, so that the kernel allows writes only beneath the
scratch directory (and no TCP, no signals out of the sandbox, where the kernel's Landlock has
them); a seccomp filter refusing new programs and processes (execve,
fork, clone but of threads) and sockets in the kernel; an audit hook (PEP 578) that refuses sockets,
processes (fork, exec, spawn, os.system, subprocess), signals to other processes, native code
(ctypes), any write, create, delete or rename outside the scratch directory (the working
directory) and opening a directory outside it. Reads are allowed (imports need them). The
program's own output goes to a file in the scratch directory.
"""

import ctypes
import json
import os
import resource
import sys

MARKER = "@@rlver_sandbox_result@@ "
_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_NOBODY = 65534
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_REFUSED = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
    "os.kill", "os.killpg", "signal.pthread_kill", "socket.__new__", "socket.connect", "socket.bind",
    "socket.getaddrinfo", "socket.gethostbyname", "socket.sendto", "socket.sendmsg", "ctypes.dlopen",
    "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function", "os.setuid",
    "os.chroot", "sys.remote_exec", "pty.spawn", "webbrowser.open", "urllib.Request", "ftplib.connect",
    "smtplib.connect", "telnetlib.Telnet.open", "http.client.connect"})
# (os.putenv stays allowed: LiveCodeBench sets OMP_NUM_THREADS, and no process is started to read it.)
# Events whose first argument(s) are paths that must lie in the scratch directory.
_PATH_EVENTS = {"os.remove": 1, "os.rename": 2, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.chown": 1,
                "os.link": 2, "os.symlink": 2, "os.truncate": 1, "os.utime": 1, "os.chdir": 1, "os.mkfifo": 1,
                "os.mknod": 1, "shutil.rmtree": 1, "shutil.move": 2, "shutil.copyfile": 2, "os.setxattr": 1,
                "os.removexattr": 1, "os.chflags": 1}


# seccomp (Linux, x86-64 and AArch64): the kernel refuses new programs and processes (execve,
# execveat, fork, vfork, and clone but of threads) and sockets, whatever Python-level route a
# program finds around the audit hook (e.g. _posixsubprocess.fork_exec, which raises no audit event).
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SYSCALLS = {"x86_64": {"execve": 59, "execveat": 322, "fork": 57, "vfork": 58, "socket": 41, "clone": 56,
                        "clone3": 435},
             "aarch64": {"execve": 221, "execveat": 281, "socket": 198, "clone": 220, "clone3": 435}}
_CLONE_THREAD = 0x10000
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_EPERM, _ENOSYS = 1, 38


def seccomp_filter() -> bool:
    """Install the filter above on this process; False where the machine or kernel has none."""
    import platform

    machine = platform.machine()
    if machine not in _AUDIT_ARCH:
        return False
    nr = _SYSCALLS[machine]

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    load, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JSET|K, BPF_RET|K
    code = [(load, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH[machine]), (ret, 0, 0, _RET_ALLOW), (load, 0, 0, 0)]
    for name in ("execve", "execveat", "fork", "vfork", "socket"):
        if name in nr:
            code += [(jeq, 0, 1, nr[name]), (ret, 0, 0, _RET_ERRNO | _EPERM)]
    code += [(jeq, 0, 1, nr["clone3"]), (ret, 0, 0, _RET_ERRNO | _ENOSYS)]  # the C library falls back to clone
    code += [(jeq, 0, 3, nr["clone"]), (load, 0, 0, 16), (jset, 1, 0, _CLONE_THREAD),  # clone's flags (low word)
             (ret, 0, 0, _RET_ERRNO | _EPERM), (ret, 0, 0, _RET_ALLOW)]
    filters = (Filter * len(code))(*[Filter(*c) for c in code])
    program = Program(len(code), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(program), 0, 0) == 0


# Landlock (Linux 5.13+, any user): the kernel allows writes (create, remove, rename, truncate, ...)
# only beneath the scratch directory, and from ABI 4 on no TCP bind or connect, from ABI 6 on no
# signals to processes outside the sandbox. Reads and the already open descriptors are untouched.
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446  # every architecture
_FS_WRITE_ABI1 = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))  # write file, remove, make *
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, 3, 5


def landlock_writes_only_in(scratch: str) -> bool:
    """Restrict this process as above; False where the kernel has no Landlock."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return False
    fs = _FS_WRITE_ABI1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0) | (
        _FS_IOCTL_DEV if abi >= 5 else 0)
    net = 0b11 if abi >= 4 else 0  # bind and connect TCP: no rule grants them
    scoped = 0b10 if abi >= 6 else 0  # signals
    attr = (ctypes.c_uint64 * 3)(fs, net, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return False

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    parent = os.open(scratch, os.O_PATH | os.O_CLOEXEC)
    try:
        rule = PathBeneath(fs, parent)
        if libc.syscall(_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule),
                        ctypes.c_uint32(0)) != 0:
            return False
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS, required first
            return False
        return libc.syscall(_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) == 0
    finally:
        os.close(parent)
        os.close(ruleset)


def _inside(path, scratch: str) -> bool:
    if isinstance(path, int):  # an open descriptor: checked when it was opened
        return True
    # Relative to the working directory, the scratch directory (LiveCodeBench's guard removes
    # os.getcwd and os.chdir, which realpath of a relative path would call).
    real = os.path.realpath(os.path.join(scratch, os.fsdecode(path)))
    return real == scratch or real.startswith(scratch + os.sep)


def _audit_hook(scratch: str):
    def hook(event, args):
        if event in _REFUSED:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = args
            writes = (mode is not None and any(c in mode for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writes and path is not None and not _inside(path, scratch):
                raise PermissionError(f"sandbox: writing {path!r} outside the scratch directory")
            # No directory descriptors from outside: a relative path under dir_fd (which the event
            # does not carry) would escape the scratch directory.
            if path is not None and not isinstance(path, int) and not _inside(path, scratch) and \
                    os.path.isdir(os.path.join(scratch, os.fsdecode(path))):
                raise PermissionError(f"sandbox: opening the directory {path!r}")
        elif event in _PATH_EVENTS:
            for path in args[:_PATH_EVENTS[event]]:
                if path is not None and not _inside(path, scratch):
                    raise PermissionError(f"sandbox: {event} on {path!r} outside the scratch directory")
    return hook


def _others_can_read(path: str) -> bool:
    """Whether users other than the owner may read directory `path` (and search every parent)."""
    import stat

    path = os.path.realpath(path)
    if not os.stat(path).st_mode & stat.S_IROTH:
        return False
    while True:
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def _confine(task: dict) -> dict:
    """Apply the limits of `task`; returns which layers took effect."""
    layers = {"network_namespace": False, "nobody": False, "landlock": False, "seccomp": False}
    # Root may make a network namespace; other users may where unprivileged user namespaces are on.
    libc = ctypes.CDLL(None, use_errno=True)
    flags = _CLONE_NEWNET if os.geteuid() == 0 else _CLONE_NEWUSER | _CLONE_NEWNET
    layers["network_namespace"] = libc.unshare(flags) == 0
    mib = 1024 * 1024
    limits = [(resource.RLIMIT_AS, task["memory_mb"] * mib), (resource.RLIMIT_CPU, task["cpu_s"]),
              (resource.RLIMIT_FSIZE, task["file_mb"] * mib), (resource.RLIMIT_NOFILE, 64),
              (resource.RLIMIT_NPROC, task["max_processes"]), (resource.RLIMIT_CORE, 0)]
    for which, value in limits:
        resource.setrlimit(which, (value, value))
    # nobody must still read the Python installation (a pyenv under /root is closed to it).
    readable = all(_others_can_read(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(os.__file__)))
    if os.geteuid() == 0 and readable:
        os.setgroups([])
        os.setgid(_NOBODY)
        os.setuid(_NOBODY)
        layers["nobody"] = True
    os.chdir(task["scratch"])
    layers["landlock"] = landlock_writes_only_in(os.path.realpath(task["scratch"]))
    layers["seccomp"] = seccomp_filter()
    return layers


def main() -> None:
    task = json.loads(sys.stdin.read())
    out = os.fdopen(os.dup(1), "w")  # the result's channel, kept from the program's own prints
    from livecodebench.evaluation import testing_util  # before the hook: imports read files

    layers = _confine(task)
    # The program's own prints go to a file in the scratch directory (RLIMIT_FSIZE bounds it).
    log = os.open("program_output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    scratch = os.path.realpath(task["scratch"])
    os.environ.clear()
    os.environ.update({"HOME": scratch, "TMPDIR": scratch, "PATH": "/nonexistent"})
    sys.addaudithook(_audit_hook(scratch))
    try:
        results, metadata = testing_util.run_test({"input_output": task["input_output"]}, test=task["code"],
                                                  debug=False, timeout=task["test_timeout_s"])
    except BaseException as e:  # the program may raise SystemExit or anything else out of run_test
        results, metadata = [-4], {"error_code": -4, "error_message": f"{type(e).__name__}: {e}"}
    results = [bool(r) if type(r).__name__ == "bool_" else (r.item(0) if hasattr(r, "item") else r) for r in results]
    out.write("\n" + MARKER + json.dumps({"results": results, "metadata": metadata, "layers": layers},
                                         default=str) + "\n")
    out.flush()
    os._exit(0)  # no atexit handlers or finalisers the program may have left behind


if __name__ == "__main__":
    main()
