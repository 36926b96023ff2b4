# The agentfly Python sandbox's interpreters. The supervisor (repl_server.py) starts this program once, as a fresh
# process (never a fork of itself), to be the *zygote*: it imports what a worker needs, then forks one worker per
# request of the supervisor and does nothing else. A worker is an interpreter whose globals persist from call to
# call (a variable set in one call is visible in the next). Forking the zygote costs a millisecond where starting
# an interpreter costs tens; and since the zygote never sees a request, nothing of an earlier chain (its code, its
# outputs) is in a worker's memory.
#
#   python3 -c <this source> WORKDIR      fd 0: the control socket to the supervisor
#
# Control: the supervisor sends b"f" (fork a worker) or b"p" (ping). For b"f" the zygote forks twice, so that the
# worker's parent is the supervisor (the PID namespace's init) and the supervisor can wait for it, and answers the
# worker's pid (4 bytes, big-endian) with two descriptors: the worker's replies (read end) and its requests (write
# end). For b"p" it answers b"p".
#
# Worker protocol: a frame is a 4-byte big-endian length and a JSON body: {"code": str, "max_output": int} in,
# {"stdout", "stderr", "error", "truncated"} out. A worker's 0, 1 and 2 are /dev/null: programs a cell starts
# (os.system, subprocess without capture) write nowhere; Python-level output is captured per cell.
import ast
import ctypes
import json
import os
import select
import signal
import socket
import struct
import sys
import traceback

WORKDIR = sys.argv[1]
LIBC = ctypes.CDLL(None)
if LIBC.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0: code under test must not read or trace it
    sys.exit("zygote: cannot clear the dumpable flag")
LIBC.prctl(15, b"agentfly-zygote", 0, 0, 0)  # PR_SET_NAME: how `ps` tells it from the workers
signal.signal(signal.SIGINT, signal.SIG_DFL)


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
            # The tool's own cut (src/Tool.ts truncate) reads this marker and adds its count to its own.
            body += "\n[... truncated: %d more characters]" % (self.total - self.kept)
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
        # sys.exit() in a cell ends the cell, not the interpreter (its variables stay): the model reads that it ran.
        error = "SystemExit: %s" % (e.code,)
        err.write(error + "\n")
    except BaseException as e:
        # Show the cell's frames only, not the worker's.
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


def read_exact(fd, n):
    chunks = []
    while n > 0:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def wait_for_request(rx):
    """Between cells, reaps the worker's children as the supervisor kills a cell's strays: their zombies would hold
    the container's pids cap, and a full cap stops the next call's client from starting. (Nothing of a cell's own
    runs between cells, so no status is taken from code that waits for its children.)"""
    while True:
        ready, _, _ = select.select([rx], [], [], 0.02)
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if ready:
            return


def worker(rx, tx):
    """A worker's life: requests from `rx`, replies to `tx`, until `rx` closes."""
    os.setsid()
    LIBC.prctl(15, b"python3", 0, 0, 0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    os.chdir(WORKDIR)
    sys.argv = [""]
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    while True:
        wait_for_request(rx)
        head = read_exact(rx, 4)
        body = None if head is None else read_exact(rx, struct.unpack(">I", head)[0])
        if body is None:
            os._exit(0)
        request = json.loads(body)
        data = json.dumps(run_cell(request["code"], namespace, request["max_output"])).encode()
        view = memoryview(struct.pack(">I", len(data)) + data)
        while view:
            view = view[os.write(tx, view):]


def fork_worker(control):
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    pid_r, pid_w = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            child = os.fork()
            if child == 0:
                for fd in (control.fileno(), requests_w, replies_r, pid_r, pid_w):
                    os.close(fd)
                try:
                    worker(requests_r, replies_w)
                finally:
                    os._exit(1)
            os.write(pid_w, struct.pack(">i", child))
        finally:
            os._exit(0)
    for fd in (requests_r, replies_w, pid_w):
        os.close(fd)
    os.waitpid(middle, 0)  # the worker is the supervisor's child from here on
    pid = read_exact(pid_r, 4)
    os.close(pid_r)
    try:
        if pid is not None:
            socket.send_fds(control, [pid], [replies_r, requests_w])
    finally:
        os.close(replies_r)
        os.close(requests_w)


def main():
    control = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    os.chdir("/")
    while True:
        command = control.recv(1)
        if command == b"f":
            fork_worker(control)
        elif command == b"p":
            control.sendall(b"p")
        else:
            os._exit(0)


main()
