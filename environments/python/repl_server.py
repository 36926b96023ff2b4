# The agentfly Python sandbox supervisor. It runs inside the sandbox as PID 1 of its PID namespace (a Docker
# container's main process, or bubblewrap's `--as-pid-1` command) and owns the *worker*: a long-lived interpreter
# whose globals persist from call to call, forked by the *zygote* (repl_worker.py: a fresh program started once,
# which never sees a request).
#
#   python3 -I -S -c <this source> CHANNEL WORKDIR WORKER_SOURCE [DIR...]
#
# CHANNEL is how requests arrive: `stdio` (one JSON request per line on stdin, one reply per line on stdout, a
# request's "id" echoed last in its reply), or `socket:UID` (the abstract unix socket `@agentfly-repl`, one request
# per connection: the client half-closes after writing it; only a peer running as UID is answered). DIR... are the
# writable places a reset empties (the work dir, /tmp, /dev/shm).
#   {"op": "run", "code": str, "timeout": seconds, "max_output": chars, "fresh": bool}
#       -> {"stdout", "stderr", "error", "timed_out", "killed", "restarted", "truncated"}
#   {"op": "reset"} -> {"ok": true} once the sandbox is proven clean, or {"ok": false, "dirty": why}
#   {"op": "ping"}  -> {"ok": true, "worker": pid}
#
# What the code under test cannot do to the supervisor and the zygote (it runs as the same user, so the kernel's
# checks do it):
# - trace them or read their memory, environment or descriptors: neither is dumpable (PR_SET_DUMPABLE 0), so
#   /proc/N/{mem,environ,fd} are root's and ptrace is refused (the sandbox's seccomp filter refuses ptrace too);
# - take the channel over or forge replies: stdin/stdout are reachable only through /proc/1/fd; an abstract socket
#   cannot be unlinked or bound twice, and a connection whose peer is not the client's user is closed unanswered;
# - signal the supervisor: the init of a PID namespace only gets the signals it handles, and it handles none;
# - leave them changed for the next chain: a reset compares their resource limits, priority, CPU affinity,
#   scheduling policy and I/O priority with the supervisor's at start-up, restores its own and replaces a zygote
#   that differs (or does not answer).
# What a chain leaves behind does not reach the next chain: a reset SIGKILLs every process of the namespace but the
# supervisor and the zygote (double-forked `setsid` daemons included) and waits until they are gone, empties
# DIR..., removes SysV IPC objects and POSIX message queues, then checks that all of it held; otherwise it answers
# "ok": false and the host destroys the sandbox. Processes a cell starts do not outlive the cell, and during a
# `fresh` run the chain's own interpreter is stopped (SIGSTOP), so nothing of the chain runs beside it.
#
# A worker that dies (the out-of-memory killer, exit(), a crash) is reported, and the next call gets a fresh one.
# Only the standard library is used: the image is Debian's minimal python3.
import ctypes
import json
import os
import platform
import resource
import select
import signal
import socket
import struct
import sys
import time

CHANNEL, WORKDIR, WORKER_SOURCE = sys.argv[1:4]
CLEAN = sys.argv[4:]
ME = os.getpid()
# A reset kills every process this user may signal: only safe as the init of the sandbox's own PID namespace,
# never as root. Anywhere else (a shell on the host, a container without its own PID namespace) it
# would kill the host's processes, so the supervisor refuses to start.
if ME != 1 or os.getuid() == 0 or os.geteuid() == 0:
    sys.exit("supervisor: must run as PID 1 of the sandbox's PID namespace and not as root (pid %d, uid %d)"
             % (ME, os.getuid()))
MAX_FRAME = 16 << 20
REPLY_FIELDS = {"stdout": str, "stderr": str, "error": (str, type(None)), "truncated": bool}

LIBC = ctypes.CDLL(None, use_errno=True)
if LIBC.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0, before any user code exists
    sys.exit("supervisor: cannot clear the dumpable flag (errno %d)" % ctypes.get_errno())
signal.signal(signal.SIGINT, signal.SIG_DFL)  # no handler: as init, the supervisor then ignores it from inside
MODES = {d: os.stat(d).st_mode & 0o7777 for d in CLEAN}

# ===== Processes =====

EXITED = {}  # pid -> wait status of children reaped before anyone asked


def reap():
    # As PID 1 the supervisor inherits every orphan: reap them, or zombies would eat the pids cap.
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        EXITED[pid] = status


def state_of(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def others(keep):
    """The processes this supervisor may signal (the sandbox user's) other than itself and `keep`: (pid, zombie)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == ME or int(name) in keep:
            continue
        pid = int(name)
        try:
            os.kill(pid, 0)
        except OSError:  # gone, or another user's (the exec transport's client)
            continue
        state = state_of(pid)
        if state is not None:
            found.append((pid, state == b"Z"))
    return found


def freeze(pid):
    """SIGSTOP, then wait (briefly) until the process is stopped; False if it is gone."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except OSError:
        return False
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline and state_of(pid) not in (None, b"T", b"t", b"Z", b"X"):
        time.sleep(0.0005)
    return True


def kill_others(keep, running=(), seconds=2.0):
    """SIGKILLs every process but the supervisor and `keep` until none is left (zombies of `keep` aside) or
    `seconds` pass; returns whether none is left. The kept processes in `running` are stopped meanwhile, so that
    they cannot start more. (Not kill(-1): it would take the zygote too.)"""
    keep = set(keep)
    if not others(keep):
        return True
    frozen = [pid for pid in running if freeze(pid)]
    try:
        deadline = time.monotonic() + seconds
        while True:
            reap()
            left = others(keep)
            if not left or all(zombie and parent_of(pid) in keep for pid, zombie in left):
                return True
            if time.monotonic() > deadline:
                return False
            for pid, zombie in left:
                if not zombie:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            time.sleep(0.001)
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass


def parent_of(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


# ===== Process attributes =====

RLIMITS = [getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_")]
# ioprio_get / ioprio_set (IOPRIO_WHO_PROCESS = 1); no wrapper in the C library.
IOPRIO = {"x86_64": (252, 251), "aarch64": (31, 30)}.get(platform.machine())


def attributes(pid):
    """What another process of the same user may change about `pid` and its future children inherit."""
    return {
        "rlimits": [resource.prlimit(pid, r) for r in RLIMITS],
        "nice": os.getpriority(os.PRIO_PROCESS, pid),
        "affinity": sorted(os.sched_getaffinity(pid)),
        "policy": os.sched_getscheduler(pid),
        "ioprio": LIBC.syscall(IOPRIO[0], 1, pid) if IOPRIO else None,
    }


def restore(initial):
    """Puts the supervisor's own attributes back where it can (an unprivileged process cannot raise a hard limit
    or its priority again); returns whether they now match."""
    for r, limits in zip(RLIMITS, initial["rlimits"]):
        try:
            resource.setrlimit(r, limits)
        except (OSError, ValueError):
            pass
    for call in (lambda: os.sched_setaffinity(0, initial["affinity"]),
                 lambda: os.sched_setscheduler(0, initial["policy"], os.sched_param(0)),
                 lambda: os.setpriority(os.PRIO_PROCESS, 0, initial["nice"]),
                 lambda: IOPRIO and LIBC.syscall(IOPRIO[1], 1, 0, initial["ioprio"])):
        try:
            call()
        except OSError:
            pass
    return attributes(0) == initial


# ===== Workers =====


def send_frame(fd, obj):
    data = json.dumps(obj).encode()
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def read_exact(fd, n):
    chunks = []
    while n > 0:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_reply(fd):
    """A worker's reply, keeping only the fields of a cell's result with their types; None if it is not one."""
    head = read_exact(fd, 4)
    if head is None or struct.unpack(">I", head)[0] > MAX_FRAME:
        return None
    body = read_exact(fd, struct.unpack(">I", head)[0])
    try:
        reply = json.loads(body)
    except (TypeError, ValueError):
        return None
    if not isinstance(reply, dict) or not all(isinstance(reply.get(k), t) for k, t in REPLY_FIELDS.items()):
        return None
    return {k: reply[k] for k in REPLY_FIELDS}


class Zygote:
    """The program that forks workers (repl_worker.py), started fresh: nothing of the supervisor is in it."""

    def __init__(self):
        self.control, child = socket.socketpair()
        null = os.open(os.devnull, os.O_RDWR)
        try:
            self.pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-c", WORKER_SOURCE, WORKDIR],
                os.environ,
                file_actions=[(os.POSIX_SPAWN_DUP2, child.fileno(), 0), (os.POSIX_SPAWN_DUP2, null, 1),
                              (os.POSIX_SPAWN_DUP2, null, 2)],
                setsid=True,
            )
        finally:
            child.close()
            os.close(null)
        # Its first answer waits for the interpreter to start (seconds on a loaded machine); later ones are quick.
        self.control.settimeout(60)

    def fork(self):
        """A new worker (pid, replies, requests), or None if the zygote does not answer."""
        try:
            os.kill(self.pid, signal.SIGCONT)  # in case code under test stopped it
            self.control.sendall(b"f")
            message, fds, _, _ = socket.recv_fds(self.control, 4, 2)
        except OSError:
            return None
        if len(message) != 4 or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            return None
        return struct.unpack(">i", message)[0], fds[0], fds[1]

    def healthy(self, initial):
        try:
            os.kill(self.pid, signal.SIGCONT)
            self.control.sendall(b"p")
            return self.control.recv(1) == b"p" and attributes(self.pid) == initial
        except OSError:
            return False

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        self.control.close()
        EXITED.pop(self.pid, None)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


class Worker:
    """An interpreter forked by the zygote, in its own session; the supervisor's child (so it can wait for it)."""

    def __init__(self, forked):
        self.pid, self.rx, self.tx = forked

    def close(self):
        for fd in (self.tx, self.rx):
            try:
                os.close(fd)
            except OSError:
                pass

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        self.exit_description()
        self.close()

    def exit_description(self):
        status = EXITED.pop(self.pid, None)
        if status is None:
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                return "the interpreter exited"
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            hint = " (out of memory?)" if sig == signal.SIGKILL else ""
            return "the interpreter was killed by signal %d%s" % (sig, hint)
        return "the interpreter exited with status %d" % os.WEXITSTATUS(status)

    def run(self, request):
        """Runs one cell; returns (reply, alive)."""
        timeout = float(request.get("timeout", 10))
        base = {"stdout": "", "stderr": "", "error": None, "truncated": False}
        try:
            send_frame(self.tx, {"code": str(request["code"]), "max_output": int(request.get("max_output", 8192))})
        except OSError:
            described = self.exit_description()
            self.close()
            return dict(base, killed=described), False
        ready, _, _ = select.select([self.rx], [], [], timeout)
        if not ready:
            self.kill()
            return dict(base, timed_out=True), False
        try:
            reply = read_reply(self.rx)
        except OSError:
            reply = None
        if reply is None:
            try:
                os.kill(self.pid, signal.SIGKILL)  # it may be alive and lying
            except OSError:
                pass
            described = self.exit_description()
            self.close()
            return dict(base, killed=described), False
        return reply, True


# ===== Reset =====


def empty(top):
    """Removes everything under `top` without recursion (directories made unreadable are opened up on the way), its
    extended attributes too, and restores its mode."""
    dirs, stack = [], [top]
    while stack:
        d = stack.pop()
        dirs.append(d)
        try:
            if d != top:
                os.chmod(d, 0o700)
            entries = list(os.scandir(d))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    os.unlink(entry.path)
            except OSError:
                pass
    for d in reversed(dirs[1:]):
        try:
            os.rmdir(d)
        except OSError:
            pass
    for name in xattrs(top):
        try:
            os.removexattr(top, name)
        except OSError:
            pass
    try:
        os.chmod(top, MODES[top])
    except OSError:
        pass  # not ours (Docker's /dev/shm is root's, 1777): nobody here could change it either


def xattrs(path):
    try:
        return os.listxattr(path)
    except OSError:
        return []


def clear_ipc():
    """Removes the namespace's SysV shared memory, semaphores and message queues, and its POSIX message queues."""
    removers = {
        "shm": lambda i: LIBC.shmctl(i, 0, None),  # IPC_RMID
        "sem": lambda i: LIBC.semctl(i, 0, 0),
        "msg": lambda i: LIBC.msgctl(i, 0, None),
    }
    problems = []
    for kind, remove in removers.items():
        path = "/proc/sysvipc/" + kind
        if not os.path.exists(path):
            continue
        for line in open(path).read().splitlines()[1:]:
            remove(int(line.split()[1]))
        if open(path).read().splitlines()[1:]:
            problems.append("SysV %s objects left" % kind)
    if os.path.isdir("/dev/mqueue"):
        for name in os.listdir("/dev/mqueue"):
            try:
                os.unlink(os.path.join("/dev/mqueue", name))
            except OSError:
                pass
        if os.listdir("/dev/mqueue"):
            problems.append("POSIX message queues left")
    return problems


class Supervisor:
    def __init__(self):
        self.initial = attributes(0)
        self.zygote = Zygote()
        self.worker = None
        self.lost = False  # the previous worker died: the next reply says the state was lost

    def keep(self):
        return [self.zygote.pid] + ([self.worker.pid] if self.worker else [])

    def new_worker(self):
        """A worker from the zygote; a zygote that does not answer is replaced once."""
        forked = self.zygote.fork()
        if forked is None:
            self.zygote.kill()
            self.zygote = Zygote()
            forked = self.zygote.fork()
        if forked is None:
            raise RuntimeError("the zygote does not answer")
        return Worker(forked)

    def reset(self):
        if self.worker:
            self.worker.kill()
        self.worker, self.lost = None, False
        problems = [] if kill_others(self.keep()) else ["processes survived SIGKILL"]
        for d in CLEAN:
            empty(d)
            if os.listdir(d) or xattrs(d):
                problems.append("%s is not empty" % d)
        problems += clear_ipc()
        if not restore(self.initial):
            problems.append("the supervisor's limits, priority or affinity were changed")
        elif not self.zygote.healthy(self.initial):
            self.zygote.kill()
            self.zygote = Zygote()
        if problems:
            return {"ok": False, "dirty": "; ".join(problems)}
        self.worker = self.new_worker()  # the next chain's interpreter, ready before it asks
        return {"ok": True}

    def run(self, request):
        was_lost = self.lost
        if self.worker is None:
            self.worker = self.new_worker()
        reply, alive = self.worker.run(request)
        if alive:
            kill_others(self.keep(), running=[self.worker.pid])
            self.lost = False
        else:
            self.worker, self.lost = None, True
            kill_others(self.keep())  # the interpreter is gone, and so is what it started
        reply["restarted"] = was_lost
        return reply

    def run_fresh(self, request):
        # The chain's interpreter is stopped for the length of the run, and nothing else of the chain is left.
        chain = [self.worker.pid] if self.worker else []
        frozen = [pid for pid in chain if freeze(pid)]
        try:
            kill_others(self.keep())
            scratch = self.new_worker()
            reply, alive = scratch.run(request)
            if alive:
                scratch.kill()
            kill_others(self.keep())
        finally:
            for pid in frozen:
                try:
                    os.kill(pid, signal.SIGCONT)
                except OSError:
                    pass
        reply["restarted"] = False
        return reply

    def handle(self, request):
        op = request.get("op")
        if op == "ping":
            return {"ok": True, "worker": self.worker.pid if self.worker else None}
        if op == "reset":
            return self.reset()
        if op == "run":
            return self.run_fresh(request) if request.get("fresh") else self.run(request)
        return {"error": "unknown op %r" % (op,)}

    def safe(self, data):
        try:
            request = json.loads(data or b"{}")
            reply = self.handle(request)
            if "id" in request:
                reply["id"] = int(request["id"])  # last: the line transports match `"id": N}` at the line's end
            return reply
        except Exception as e:  # a bad request must not take the supervisor down
            return {"error": "supervisor: %s" % e}


# ===== Channels =====


def serve_socket(supervisor, client_uid):
    if client_uid == os.getuid():
        sys.exit("supervisor: the client must run as another user than the code under test")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0agentfly-repl")
    server.listen(64)
    while True:
        ready, _, _ = select.select([server], [], [], 1.0)
        reap()
        if not ready:
            continue
        conn, _ = server.accept()
        try:
            _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid != client_uid:
                continue
            conn.settimeout(10)
            data = b""
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            conn.sendall(json.dumps(supervisor.safe(data)).encode())
        except OSError:
            pass
        finally:
            conn.close()


def serve_stdio(supervisor):
    buffer = b""
    while True:
        ready, _, _ = select.select([0], [], [], 1.0)
        reap()
        if not ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            out = (json.dumps(supervisor.safe(line)) + "\n").encode()
            view = memoryview(out)
            while view:
                view = view[os.write(1, view):]


def main():
    if CHANNEL == "stdio":
        serve_stdio(Supervisor())
    elif CHANNEL.startswith("socket:"):
        serve_socket(Supervisor(), int(CHANNEL.split(":", 1)[1]))
    else:
        sys.exit("supervisor: unknown channel %r" % CHANNEL)


main()
