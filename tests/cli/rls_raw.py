"""rls_raw.py — requests to rl-sync's side sockets made without the rl-sync
client, as a peer without the shared key would send them (tests of
--auth-key-file on the bulk stream and the shared memory service).

  python3 rls_raw.py bulk tcp://127.0.0.1:PORT VERSION
      asks the bulk stream for chunk 0 of VERSION (48-byte request, no key);
      prints "STATUS BYTES MESSAGE" of the first reply header
  python3 rls_raw.py shm-put NAME VERSION
      hands the shared memory service a sealed memfd of 4096 bytes as the
      object of VERSION (op PUT, no key); prints the reply's status
"""
import os
import socket
import struct
import sys


def recvn(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            break
        b += c
    return b


def bulk(url, version):
    host, port = url[len("tcp://"):].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    # u32 "RLSB", u16 1, u16 GET, u32 48, u32 0, u64 version, first, count, 0
    s.sendall(b"RLSB" + struct.pack("<HHII", 1, 1, 48, 0) + struct.pack("<QQQQ", version, 0, 1, 0))
    h = recvn(s, 48)
    if len(h) < 48:
        print("closed", len(h))
        return
    status, = struct.unpack("<i", h[12:16])
    n, = struct.unpack("<Q", h[32:40])
    body = recvn(s, n)
    print(status, len(body), body.decode("utf-8", "replace") if status else "")


def shm_put(name, version):
    fd = os.memfd_create("rls-raw", os.MFD_ALLOW_SEALING)
    os.write(fd, b"\x5a" * 4096)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect("\0" + name)
    # u32 "RLSM", u16 1, u16 PUT, u32 24, u32 0, u64 version
    req = b"RLSM" + struct.pack("<HHIIQ", 1, 2, 24, 0, version)
    socket.send_fds(s, [req], [fd])
    rep = recvn(s, 32)
    print(struct.unpack("<i", rep[12:16])[0] if len(rep) == 32 else "closed")


if sys.argv[1] == "bulk":
    bulk(sys.argv[2], int(sys.argv[3]))
else:
    shm_put(sys.argv[2], int(sys.argv[3]))
