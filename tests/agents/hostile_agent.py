"""A hostile agent program (``agent.command``, tests/agents/test_sandboxed_agent.py): it tries to get out
of its sandbox and writes what worked to its result, ``{"reward": 1.0, "escapes": [...], "endpoint":
status}``.

Usage: ``python hostile_agent.py RUN_DIR SECRET_FILE HOST_PORT``. It tries to write into RUN_DIR and
to list it, to read SECRET_FILE (a key in a tmp HOME), to connect to HOST_PORT on the host's
loopback (the recording endpoint listens on such a port) and to an outside address, to connect to
every unix socket it finds on the host's usual paths, to see the trainer's process or environment
and another listener in its network namespace (another episode's); then it makes one chat request
to its own endpoint (``OPENAI_BASE_URL``, its key), which must work. Standard library only."""

import json
import os
import socket
import stat
import sys
import urllib.request
from urllib.parse import urlparse


def attempt(name, fn, escapes):
    try:
        fn()
    except Exception:  # noqa: BLE001 - blocked, however
        return
    escapes.append(name)


def write_into(path):
    with open(os.path.join(path, "escaped.txt"), "w") as f:
        f.write("out")


def read(path):
    with open(path) as f:
        return f.read()


def connect(addr):
    socket.create_connection(addr, timeout=2).close()


def unix_sockets():
    found = []
    for top in ("/run", "/var/run", "/tmp", os.path.expanduser("~")):
        for root, dirs, files in os.walk(top):
            if root.count("/") > 5:
                dirs[:] = []
            for name in files + dirs:
                path = os.path.join(root, name)
                try:
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        found.append(path)
                except OSError:
                    pass
            if len(found) > 20:
                return found
    return found


def connect_unix(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        s.connect(path)


def listening_ports():
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = read(table).splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def trainer_visible():
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
                if b"pytest" in cmdline and b"hostile_agent" not in cmdline:  # (its own args name pytest's dirs)
                    return True
            except OSError:
                pass
    return False


def own_endpoint(task):
    base = os.environ["OPENAI_BASE_URL"]
    body = {"model": "agentrl-policy", "messages": task["messages"], "max_tokens": 4}
    req = urllib.request.Request(
        base + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status


def main():
    run_dir, secret, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    task = json.loads(os.environ["AGENTRL_TASK"])
    escapes = []
    attempt("write into the run dir", lambda: write_into(run_dir), escapes)
    attempt("list the run dir", lambda: os.listdir(run_dir), escapes)
    attempt("read the secret key", lambda: read(secret), escapes)
    attempt("connect to the host's loopback port", lambda: connect(("127.0.0.1", port)), escapes)
    attempt("connect outside", lambda: connect(("192.0.2.1", 80)), escapes)
    for path in unix_sockets():
        attempt(f"connect to the unix socket {path}", lambda p=path: connect_unix(p), escapes)
    if os.environ.get("AGENTRL_TEST_SECRET"):
        escapes.append("read the trainer's environment")
    if trainer_visible():
        escapes.append("see the trainer's process")
    others = listening_ports() - {urlparse(os.environ["OPENAI_BASE_URL"]).port}
    if others:
        escapes.append(f"see other listeners {sorted(others)}")
    try:
        endpoint = own_endpoint(task)
    except Exception as e:  # noqa: BLE001
        endpoint = f"{type(e).__name__}: {e}"
    result = {"reward": 1.0, "escapes": escapes, "endpoint": endpoint}
    with open(os.environ["AGENTRL_RESULT"], "w") as f:
        json.dump(result, f)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
