#!/usr/bin/env python3
"""A tiny rsh between the two guests of test/vm/run_pair.sh.

  vm_rsh.py serve ADDR             (VM 2) run commands for clients until one sends stop
  vm_rsh.py HOST CMD [ARGS...]     run CMD ARGS (joined by spaces, as ssh does) with
                                   `bash -c` on HOST; exit with its status
  vm_rsh.py --stop HOST            tell HOST's server to kill what still runs and exit
  vm_rsh.py --probe HOST           exit 0 if HOST's server accepts a connection within 5 s

It is what Open MPI's rsh launcher needs from ssh (mpirun --mca plm_rsh_agent
vm_rsh.py starts the remote orted with `vm_rsh.py HOST orted ...`), without ssh,
which is not installed: no authentication, the link joins only two throw-away
guests. The remote command gets the server's environment and working directory
(the caller's, passed on by run.sh) and stdin from /dev/null; its stdout and
stderr come back apart. When the client goes away (mpirun kills its agent), the
command's process group is killed, as a hung-up ssh session would.

The protocol, over TCP port 7070: the client sends the command's length (4 bytes)
and the command (empty: stop); the server sends frames of a kind byte (o: stdout,
e: stderr, x: exit status, 4 bytes signed), a 4-byte length and the payload.
"""
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

PORT = 7070
CONNECT_LIMIT_S = 120  # the server's guest may still be booting


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def session(conn, stop):
    """Runs one client's command and streams its output back."""
    head = recv_exact(conn, 4)
    cmd = recv_exact(conn, struct.unpack("!I", head)[0]) if head else None
    if cmd is None:
        conn.close()
        return
    lock = threading.Lock()

    def send(kind, payload):
        with lock:
            conn.sendall(kind + struct.pack("!I", len(payload)) + payload)

    if cmd == b"":
        send(b"x", struct.pack("!i", 0))
        conn.close()
        stop.set()
        return
    proc = subprocess.Popen(["bash", "-c", cmd.decode()], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, b"o")
    sel.register(proc.stderr, selectors.EVENT_READ, b"e")
    sel.register(conn, selectors.EVENT_READ, None)
    open_pipes = 2
    try:
        while open_pipes > 0:
            for key, _ in sel.select():
                if key.data is None:  # the client sends nothing more: readable means gone
                    raise ConnectionError("client went away")
                data = os.read(key.fd, 65536)
                if data:
                    send(key.data, data)
                else:
                    sel.unregister(key.fileobj)
                    open_pipes -= 1
        status = proc.wait()
        send(b"x", struct.pack("!i", status if status >= 0 else 128 - status))
    except OSError as e:  # ConnectionError included
        print(f"vm_rsh: {cmd.decode()[:80]!r}: {e}; killing it", file=sys.stderr)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    finally:
        conn.close()


def serve(addr):
    stop = threading.Event()
    lsock = socket.create_server((addr, PORT))
    lsock.settimeout(0.2)
    print(f"vm_rsh: serving on {addr}:{PORT} as {socket.gethostname()}", file=sys.stderr, flush=True)
    while not stop.is_set():
        try:
            conn, _ = lsock.accept()
        except socket.timeout:
            continue
        conn.settimeout(None)
        threading.Thread(target=session, args=(conn, stop), daemon=True).start()
    print("vm_rsh: stopped", file=sys.stderr, flush=True)
    return 0


def connect(host):
    deadline = time.monotonic() + CONNECT_LIMIT_S
    while True:
        try:
            return socket.create_connection((host, PORT), timeout=5)
        except OSError as e:
            if time.monotonic() > deadline:
                print(f"vm_rsh: cannot reach {host}:{PORT}: {e}", file=sys.stderr)
                sys.exit(255)
            time.sleep(0.2)


def client(host, cmd):
    sock = connect(host)
    sock.settimeout(None)
    data = cmd.encode()
    sock.sendall(struct.pack("!I", len(data)) + data)
    out = {b"o": sys.stdout.buffer, b"e": sys.stderr.buffer}
    while True:
        head = recv_exact(sock, 5)
        if head is None:
            print(f"vm_rsh: {host} closed the connection without an exit status", file=sys.stderr)
            return 255
        payload = recv_exact(sock, struct.unpack("!I", head[1:])[0])
        if payload is None:
            return 255
        if head[:1] == b"x":
            return struct.unpack("!i", payload)[0]
        out[head[:1]].write(payload)
        out[head[:1]].flush()


def main(argv):
    if len(argv) == 2 and argv[0] == "serve":
        return serve(argv[1])
    if len(argv) == 2 and argv[0] == "--stop":
        return client(argv[1], "")
    if len(argv) == 2 and argv[0] == "--probe":
        try:
            socket.create_connection((argv[1], PORT), timeout=5).close()
            return 0
        except OSError:
            return 1
    if len(argv) >= 2 and not argv[0].startswith("-"):
        return client(argv[0], " ".join(argv[1:]))
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
