#!/usr/bin/env python3
"""stall_proxy.py PORT SECONDS: a TCP proxy to 127.0.0.1:PORT that, for its
first SECONDS, takes each connection and answers nothing (a TLS handshake
through it stalls), then relays connections both ways.  Prints its own port."""
import socket
import sys
import threading
import time


def relay(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def main():
    target, silent = int(sys.argv[1]), float(sys.argv[2])
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    print(ls.getsockname()[1], flush=True)
    t0, held = time.monotonic(), []
    while True:
        c, _ = ls.accept()
        if time.monotonic() - t0 < silent:
            held.append(c)   # never read, never closed: the peer waits
            continue
        u = socket.create_connection(("127.0.0.1", target))
        threading.Thread(target=relay, args=(c, u), daemon=True).start()
        threading.Thread(target=relay, args=(u, c), daemon=True).start()


main()
