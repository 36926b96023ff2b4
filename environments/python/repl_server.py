# The agentfly Python sandbox supervisor. It runs inside the sandbox (PID 1 of a Docker container, or the child of
# bubblewrap), listens on a unix socket in the work dir and owns one long-lived *worker* process whose globals
# persist from call to call: a variable set in one call is visible in the next.
#
# Protocol: one JSON request per connection (the client half-closes after writing it), one JSON response back;
# or, with "-" as the socket path, one JSON request per line on stdin and one reply per line on stdout (a request's
# "id" is echoed in its reply).
#   {"op": "run", "code": str, "timeout": seconds, "max_output": chars, "fresh": bool}
#       -> {"stdout", "stderr", "error", "timed_out", "killed", "restarted", "truncated"}
#   {"op": "reset"} -> {"ok": true}      kill the worker, empty the work dir, start a new worker
#   {"op": "ping"}  -> {"ok": true, "worker": pid}
#
# The worker runs in its own session so that a timeout kills it with everything it forked. If the worker dies
# (killed by the out-of-memory killer, exit(), a crash) the reply says so and the next call gets a fresh one.
# Only the standard library is used: the image is Debian's minimal python3.
import ast
import json
import os
import select
import shutil
import signal
import socket
import struct
import sys
import time
import traceback

SOCKET = sys.argv[1]
WORKDIR = sys.argv[2]


def reap():
    # The supervisor is PID 1 in a container: it must reap orphans, or zombies would eat the pids cap.
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class Capture:
    """A text sink that keeps at most `limit` characters and counts the rest."""

    def __init__(self, limit):
        self.limit = limit
        self.parts = []
        self.kept = 0
        self.total = 0

    def write(self, s):
        s = str(s)
        self.total += len(s)
        room = self.limit - self.kept
        if room > 0:
            piece = s[:room]
            self.parts.append(piece)
            self.kept += len(piece)
        return len(s)

    def flush(self):
        pass

    def text(self):
        body = "".join(self.parts)
        if self.total > self.kept:
            body += "\n...[truncated %d characters]" % (self.total - self.kept)
        return body


def run_cell(code, namespace, max_output):
    out, err = Capture(max_output), Capture(max_output)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    error = None
    try:
        tree = ast.parse(code, "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), namespace)
        if last is not None:
            value = eval(compile(last, "<cell>", "eval"), namespace)
            if value is not None:
                print(repr(value))
    except SystemExit as e:
        error = "SystemExit: %s" % (e.code,)
    except BaseException as e:
        # Show the cell's frames only, not the supervisor's.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb, file=err)
        error = "%s: %s" % (type(e).__name__, e)
    finally:
        sys.stdout, sys.stderr = saved
    return {
        "stdout": out.text(),
        "stderr": err.text(),
        "error": error,
        "truncated": out.total > out.kept or err.total > err.kept,
    }


def kill_strays():
    """Kills every other process of the worker's session: processes a cell starts do not outlive it (they would
    hold pids under the cap and run code between calls)."""
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                session = int(f.read().rsplit(")", 1)[1].split()[3])
            if session == me:
                os.kill(int(name), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.005)


def send_frame(fd, obj):
    data = json.dumps(obj).encode()
    os.write(fd, struct.pack(">I", len(data)))
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_exact(fd, n):
    chunks = []
    while n > 0:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd):
    head = read_exact(fd, 4)
    if head is None:
        return None
    body = read_exact(fd, struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body)


class Worker:
    def __init__(self):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.setsid()
            # Drop every inherited descriptor (the listening socket, the client's connection) but our pipes:
            # a client must see its connection close when the supervisor closes it.
            keep = sorted((to_child_r, from_child_w))
            os.closerange(3, keep[0])
            os.closerange(keep[0] + 1, keep[1])
            os.closerange(keep[1] + 1, 65536)
            os.chdir(WORKDIR)
            # Programs the cell starts (os.system, subprocess without capture) must not write into the sandbox's
            # log on the host: their stdin/stdout/stderr are /dev/null. Python-level output is captured per cell.
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.close(null)
            namespace = {"__name__": "__main__", "__builtins__": __builtins__}
            while True:
                request = read_frame(to_child_r)
                if request is None:
                    os._exit(0)
                reply = run_cell(request["code"], namespace, request["max_output"])
                kill_strays()
                send_frame(from_child_w, reply)
        os.close(to_child_r)
        os.close(from_child_w)
        self.pid, self.tx, self.rx = pid, to_child_w, from_child_r

    def kill(self):
        for target in (lambda: os.killpg(self.pid, signal.SIGKILL), lambda: os.kill(self.pid, signal.SIGKILL)):
            try:
                target()
            except OSError:
                pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        for fd in (self.tx, self.rx):
            try:
                os.close(fd)
            except OSError:
                pass
        reap()

    def exit_description(self):
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
            send_frame(self.tx, {"code": request["code"], "max_output": int(request.get("max_output", 8192))})
        except OSError:
            return dict(base, killed=self.exit_description()), False
        ready, _, _ = select.select([self.rx], [], [], timeout)
        if not ready:
            self.kill()
            return dict(base, timed_out=True), False
        try:
            reply = read_frame(self.rx)
        except (OSError, ValueError):
            reply = None
        if reply is None:
            described = self.exit_description()
            self.kill()
            return dict(base, killed=described), False
        return reply, True


def empty_workdir(keep):
    for name in os.listdir(WORKDIR):
        path = os.path.join(WORKDIR, name)
        if keep is not None and path == keep:
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


class Supervisor:
    def __init__(self, keep):
        self.keep = keep  # the socket dir, kept when the work dir is emptied
        self.worker = None
        self.lost = False  # the previous worker died: the next reply says the state was lost

    def handle(self, request):
        op = request.get("op")
        if op == "ping":
            return {"ok": True, "worker": self.worker.pid if self.worker else None}
        if op == "reset":
            if self.worker:
                self.worker.kill()
            self.worker, self.lost = None, False
            empty_workdir(self.keep)
            self.worker = Worker()
            return {"ok": True}
        if op == "run" and request.get("fresh"):
            scratch = Worker()
            reply, alive = scratch.run(request)
            if alive:
                scratch.kill()
            reply["restarted"] = False
            return reply
        if op == "run":
            was_lost = self.lost
            if self.worker is None:
                self.worker = Worker()
            reply, alive = self.worker.run(request)
            reply["restarted"] = was_lost
            if not alive:
                self.worker, self.lost = None, True
            else:
                self.lost = False
            return reply
        return {"error": "unknown op %r" % (op,)}

    def safe(self, data):
        try:
            request = json.loads(data or b"{}")
            reply = self.handle(request)
            if "id" in request:
                reply["id"] = request["id"]
            return reply
        except Exception as e:  # a bad request must not take the supervisor down
            return {"error": "supervisor: %s" % e}


def serve_socket(supervisor):
    sock_dir = os.path.dirname(SOCKET)
    os.makedirs(sock_dir, exist_ok=True)
    if os.path.exists(SOCKET):
        os.unlink(SOCKET)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(SOCKET)
    server.listen(16)
    while True:
        ready, _, _ = select.select([server], [], [], 1.0)
        reap()
        if not ready:
            continue
        conn, _ = server.accept()
        try:
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
    # One JSON request per line on stdin (the container's attached stdin), one reply per line on stdout.
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
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if SOCKET == "-":
        serve_stdio(Supervisor(None))
    else:
        serve_socket(Supervisor(os.path.dirname(SOCKET)))


main()
