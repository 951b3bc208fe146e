"""The in-container executor of the Docker backend. This file runs INSIDE the sandbox container.

Why it exists: a ``docker exec`` costs ~60 ms here (runc starts, joins the namespaces, the daemon
plumbs the streams), most of a tool call, and it makes a warm container barely faster than a cold
``docker run``. So each container's main process (pid 1, the sandbox user) is this executor; the
host attaches to its stdin/stdout once and each run costs one fork+exec inside the container.

Why pid 1 (and not docker's ``--init``): the kernel never delivers a signal from inside a pid
namespace to that namespace's init unless it installed a handler, so a program's ``kill -9 -1``,
``kill -STOP 1`` or ``kill -9 $PPID`` cannot take the executor down, and it marks itself
non-dumpable so a program of the same uid cannot ptrace it or open ``/proc/1/fd``. Being init it
reaps every orphan, which is what ``--init`` (tini) would have done. When it exits the kernel kills
everything left in the namespace, and the container (``auto_remove``) disappears: a trainer that
dies closes the attach stream, the executor reads EOF and exits, and nothing leaks.

The host (``agentrl.sandbox.docker.conn``) starts it with ``python3 -I -c SRC``, where SRC is
``agentrl.sandbox.files`` loaded as module ``sandbox_files`` (so copying files in and out applies
exactly the checks the local backend applies) and ``agentrl.sandbox.docker.agent.procs`` as module
``sandbox_procs`` (killing, reaping, wiping, the OOM counter), followed by this file, which owns the
protocol loop and one run (spawn, pump the pipes under the deadline and the output cap, collect).

Protocol (both directions): ``>II`` (header length, payload length), a JSON header, the payload.

* executor -> host, once at start: ``{"op": "hello", "pid", "oom_source", "dumpable"}``.
* ``{"op": "run", "argv", "env", "timeout", "cap", "files": [[name, size], ...], "stdin": bool,
  "collect": [...], "max_file", "max_total", "reset": bool}``, payload = the files' bytes then
  stdin. Reply: ``{"status", "exit_code", "signal", "oom", "wall", "truncated", "out", "err",
  "files": [[name, size], ...], "refused": {name: why}, "clean", "why", "error"}``, payload =
  stdout, stderr, then the collected files' bytes. Every process of the sandbox user is killed
  after every run (sessions keep files, not processes).
* ``{"op": "reset"}``: kill every process, wipe the work dir, /dev/shm and /dev/mqueue, check that
  nothing (files, processes, System V IPC objects) is left. Reply ``{"clean": bool, "why": str}``.
* EOF on stdin (the host closed the stream): kill everything and exit.

The host treats every reply as untrusted (sizes are checked against what it asked for) and
enforces the deadline too: an executor that does not answer in time costs the container.
"""

import json
import os
import select
import signal
import struct
import sys
import time

PIPE_GRACE_S = 0.2  # read output held open by a background child this long after the program exits
_pending = bytearray()


# ------------------------------------------------------------------------------------- framing
def _read_exact(n):
    while len(_pending) < n:
        chunk = os.read(0, max(65536, n - len(_pending)))
        if not chunk:
            raise EOFError
        _pending.extend(chunk)
    data = bytes(_pending[:n])
    del _pending[:n]
    return data


def _recv():
    hlen, plen = struct.unpack(">II", _read_exact(8))
    return json.loads(_read_exact(hlen)), _read_exact(plen)


def _write_all(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def _send(header, payload=b""):
    head = json.dumps(header).encode()
    _write_all(struct.pack(">II", len(head), len(payload)) + head)
    if payload:
        _write_all(payload)


# ------------------------------------------------------------------------------------- one run
def _spawn(argv, env, with_stdin):
    """fork+exec ``argv`` as a session leader in the work dir; returns (pid, stdin fd or None,
    stdout fd, stderr fd). Raises OSError naming why exec failed (reported over a CLOEXEC pipe)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe() if with_stdin else (os.open("/dev/null", os.O_RDONLY), None)
    rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # child: only async-signal-safe-ish work until exec; report failures on rep_w
        try:
            os.setsid()
            _set_all(CATCHABLE + [signal.SIGCHLD], signal.SIG_DFL)  # exec keeps "ignored": programs expect defaults
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.closerange(3, rep_w)
            os.closerange(rep_w + 1, 1 << 16)
            _prctl_dumpable(1)  # we are non-dumpable, so /proc/self is root's until this (or exec)
            try:
                with open("/proc/self/oom_score_adj", "w") as f:
                    f.write("1000")  # the program dies before us when the container runs out of memory
            except OSError:
                pass
            os.chdir(procs.WORKDIR)
            os.execvpe(argv[0], argv, env)
        except BaseException as e:
            try:
                os.write(rep_w, f"{type(e).__name__}: {e}".encode()[:1000])
            finally:
                os._exit(127)
    for fd in (out_w, err_w, in_r, rep_w):
        os.close(fd)
    why = b""
    while chunk := os.read(rep_r, 1000):
        why += chunk
    os.close(rep_r)
    if why:
        os.waitpid(pid, 0)
        for fd in (out_r, err_r, in_w):
            if fd is not None:
                os.close(fd)
        raise OSError(why.decode(errors="replace"))
    procs.WATCHED.add(pid)
    return pid, in_w, out_r, err_r


def _pump(pid, in_fd, out_fd, err_fd, stdin, timeout, cap):
    """Feed stdin, read both pipes under the cap, kill at the deadline or on overflow.
    Returns (how we killed it or None, stdout, stderr, truncated)."""
    deadline = time.monotonic() + timeout
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    open_fds = set(bufs)
    for fd in open_fds:
        os.set_blocking(fd, False)
    to_write = memoryview(stdin) if stdin else None
    if in_fd is not None:
        os.set_blocking(in_fd, False)
        if to_write is None:
            os.close(in_fd)
            in_fd = None
    killed, ended, truncated = None, None, False
    while open_fds or ended is None:  # a program that closed its pipes still runs until its deadline
        procs.reap()
        now = time.monotonic()
        if ended is None and pid in procs.EXITED:
            ended = now
        if ended is None and now >= deadline:
            killed, ended = "timeout", now
            procs.kill_all()
        if ended is not None and (not open_fds or now - ended > PIPE_GRACE_S):
            break  # done; or a background child holds the pipes, and what it prints is not this run's
        wait = max(0.0, deadline - now) if ended is None else PIPE_GRACE_S
        wfds = [in_fd] if to_write is not None else []
        r, w, _ = select.select(list(open_fds) + [0, WAKE_R], wfds, [], wait)
        if WAKE_R in r:
            try:
                os.read(WAKE_R, 4096)
            except BlockingIOError:
                pass
        if 0 in r:
            chunk = os.read(0, 65536)
            if not chunk:  # the host is gone: nobody will read the result
                procs.kill_all()
                sys.exit(0)
            _pending.extend(chunk)
        if w:
            try:
                to_write = to_write[os.write(in_fd, to_write[:65536]) :]
            except BlockingIOError:
                pass
            except BrokenPipeError:
                to_write = to_write[:0]
            if not len(to_write):
                os.close(in_fd)
                in_fd, to_write = None, None
        for fd in open_fds.intersection(r):
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                open_fds.discard(fd)
                continue
            buf = bufs[fd]
            room = cap - len(buf)
            buf.extend(chunk[: max(room, 0)])
            if len(chunk) > room:
                truncated = True
                if killed is None and ended is None:
                    killed, ended = "output_limit", time.monotonic()
                    procs.kill_all()
    for fd in [out_fd, err_fd] + ([in_fd] if in_fd is not None else []):
        os.close(fd)
    return killed, bytes(bufs[out_fd]), bytes(bufs[err_fd]), truncated


def run(req, payload):
    t0 = time.monotonic()
    off, files_in = 0, {}
    for name, size in req["files"]:
        files_in[name] = payload[off : off + size]
        off += size
    stdin = payload[off:] if req["stdin"] else None
    reply = {
        "status": "ok",
        "exit_code": None,
        "signal": None,
        "oom": False,
        "truncated": False,
        "wall": 0.0,
        "out": 0,
        "err": 0,
        "files": [],
        "refused": {},
        "clean": None,
        "why": "",
        "error": None,
    }
    parts = []
    try:
        files.write_files(procs.WORKDIR, files_in, max_total_bytes=req["max_total"])
    except (OSError, ValueError, TypeError) as e:
        reply.update(status="error", error=f"cannot write the input files: {e}")
    else:
        oom_before = procs.oom_kills()
        try:
            pid, in_fd, out_fd, err_fd = _spawn(req["argv"], req["env"], stdin is not None)
        except OSError as e:
            reply.update(status="spawn_error", error=f"cannot start {req['argv'][0]!r}: {e}")
        else:
            killed, out, err, reply["truncated"] = _pump(pid, in_fd, out_fd, err_fd, stdin, req["timeout"], req["cap"])
            procs.kill_all()  # nothing a run started outlives it (sessions keep files, not processes)
            while pid not in procs.EXITED:  # kill_all reaped it unless it is still dying
                procs.reap()
                time.sleep(0.001)
            procs.WATCHED.discard(pid)
            code = procs.EXITED.pop(pid)
            reply["wall"] = time.monotonic() - t0
            reply["exit_code"] = code
            if killed:
                reply["status"] = killed
            elif code < 0:
                reply["signal"] = -code
            reply["oom"] = procs.oom_kills() > oom_before
            reply["out"], reply["err"] = len(out), len(err)
            parts += [out, err]
    if req["collect"]:
        got = files.collect_files(
            procs.WORKDIR, req["collect"], max_file_bytes=req["max_file"], max_total_bytes=req["max_total"]
        )
        reply["refused"] = got.refused
        for name, data in got.files.items():
            reply["files"].append([name, len(data)])
            parts.append(data)
    if req["reset"]:
        reply.update(procs.reset())
    return reply, parts


def _prctl_dumpable(flag):
    """PR_SET_DUMPABLE: at 0, programs of our uid can neither ptrace us nor open /proc/1/fd/*."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(4, flag, 0, 0, 0) == 0
    except (OSError, AttributeError, ImportError):
        return False


def _set_all(signals, how):
    for sig in signals:
        try:
            signal.signal(sig, how)
        except (OSError, ValueError):  # glibc keeps two real-time signals for itself
            pass


def main():
    # Under runc the kernel already drops signals sent to pid 1 from inside its namespace unless
    # pid 1 handles them; ignoring every catchable one (SIGCHLD aside) also holds under gVisor,
    # which delivers them. SIGKILL/SIGSTOP cannot be ignored: gVisor lets a program use them on us.
    _set_all(CATCHABLE, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # with the wakeup fd: a child's exit wakes select()
    signal.set_wakeup_fd(WAKE_W)
    dumpable = not _prctl_dumpable(0)
    try:
        _send({"op": "hello", "pid": os.getpid(), "oom_source": procs.OOM_SOURCE, "dumpable": dumpable})
        while True:
            try:
                req, payload = _recv()
            except EOFError:
                break
            if req.get("op") == "run":
                try:
                    reply, parts = run(req, payload)
                except Exception as e:  # our own bug: a typed error for this run, not a dead container
                    procs.kill_all()
                    reply, parts = (
                        {
                            "status": "error",
                            "error": f"sandbox executor failed: {type(e).__name__}: {e}",
                            "clean": False,
                            "why": "the executor failed",
                        },
                        [],
                    )
                _send(reply, b"".join(parts))
            elif req.get("op") == "reset":
                _send(procs.reset())
            else:
                _send({"error": f"unknown op {req.get('op')!r}"})
    except BrokenPipeError:
        pass  # the host hung up
    procs.kill_all()


if __name__ == "__main__":  # the bootstrap runs us as __main__; importing this on the host does nothing
    import sandbox_files as files  # injected by the bootstrap (agentrl/sandbox/files.py)
    import sandbox_procs as procs  # injected by the bootstrap (agentrl/sandbox/docker/agent/procs.py)

    CATCHABLE = sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD})
    WAKE_R, WAKE_W = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    main()
