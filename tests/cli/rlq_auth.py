"""rlq_auth.py — signs rl-queue requests with Python's hmac/hashlib and
python3-cryptography's Poly1305 (implementations independent of
lib/base/auth.c) for tests of --auth-key-file.

  python3 rlq_auth.py tcp://127.0.0.1:PORT KEYFILE stat
      one STAT request signed with the key; prints "STATUS MESSAGE-or-size"
  python3 rlq_auth.py tcp://127.0.0.1:PORT KEYFILE replay
      the same signed STAT request sent twice, byte for byte; prints both
  python3 rlq_auth.py tcp://127.0.0.1:PORT KEYFILE stale
      a STAT request signed with a time 10 minutes ago
  python3 rlq_auth.py tcp://127.0.0.1:PORT KEYFILE ack
      a signed ACK (a body of 24 bytes: lease 12345, release id 1), then the
      same request signed anew with one byte of its body flipped after signing
  python3 rlq_auth.py URL KEYFILE head
      a STAT and then that ACK with the header-only proof a client sends over
      tls+tcp:// (HMAC(K, "rlpipe header only 1\\0" || header)); prints both
A tls+tcp:// URL is dialled with Python's ssl and the files in RL_TLS_CA,
RL_TLS_CERT and RL_TLS_KEY (the address is not matched to the certificate,
as the C clients do not for an IP address).
"""
import hashlib
import hmac
import os
import socket
import ssl
import struct
import sys
import time

from cryptography.hazmat.primitives.poly1305 import Poly1305

OP_ACK = 4
OP_STAT = 6
FLAG_AUTH = 8


def _recvn(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise ConnectionError("closed by the broker")
        b += c
    return b


def seal(key, a, b):
    """docs/queue.md, "Shared key": HMAC(K, a || Poly1305(Km, b)), Km = HMAC(K, label || a)"""
    km = hmac.new(key, b"rlpipe body key 1\0" + a, hashlib.sha256).digest()
    tag = Poly1305.generate_tag(km, b)
    return hmac.new(key, a + tag, hashlib.sha256).digest()


def seal_head(key, a):
    """docs/queue.md, "Shared key", over TLS: HMAC(K, label || a)"""
    return hmac.new(key, b"rlpipe header only 1\0" + a, hashlib.sha256).digest()


def signed(key, op, body=b"", t_ns=None, head=False):
    t_ns = time.time_ns() if t_ns is None else t_ns
    hdr = b"RLQP" + bytes([1, op]) + struct.pack("<HHHI", FLAG_AUTH, 80, 0, len(body))
    hdr += struct.pack("<QQ", 7, 0) + struct.pack("<QQ", t_ns, int.from_bytes(os.urandom(8), "little"))
    mac = seal_head(key, hdr) if head else seal(key, hdr, body)
    return hdr + mac + body


def send(s, msg, rid):
    m = struct.pack(">I", 0x80000000 | rid) + msg
    s.sendall(struct.pack(">Q", len(m)) + m)
    n = struct.unpack(">Q", _recvn(s, 8))[0]
    rep = _recvn(s, n)[4:]
    hl = struct.unpack("<H", rep[8:10])[0]
    status = struct.unpack("<H", rep[10:12])[0]
    body = rep[hl:]
    return status, body.decode("utf-8", "replace") if status else "%d bytes" % len(body)


def main():
    url, keyfile, what = sys.argv[1:4]
    key = open(keyfile, "rb").read().rstrip(b"\r\n")
    tls = url.startswith("tls+tcp://")
    host, port = url[len("tls+tcp://" if tls else "tcp://"):].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    if tls:
        ctx = ssl.create_default_context(cafile=os.environ["RL_TLS_CA"])
        ctx.check_hostname = False
        ctx.load_cert_chain(os.environ["RL_TLS_CERT"], os.environ["RL_TLS_KEY"])
        s = ctx.wrap_socket(s)
    s.sendall(b"\x00SP\x00" + struct.pack(">H", 0x30) + b"\x00\x00")
    _recvn(s, 8)
    body = struct.pack("<QII", 12345, 1, 1) + struct.pack("<Q", 1)
    if what == "head":
        print(*send(s, signed(key, OP_STAT, head=True), 1))
        print(*send(s, signed(key, OP_ACK, body, head=True), 2))
        s.close()
        return
    if what == "ack":
        print(*send(s, signed(key, OP_ACK, body), 1))
        msg = bytearray(signed(key, OP_ACK, body))
        msg[-3] ^= 1
        print(*send(s, bytes(msg), 2))
        s.close()
        return
    if what == "stale":
        msg = signed(key, OP_STAT, t_ns=time.time_ns() - 600 * 10**9)
    else:
        msg = signed(key, OP_STAT)
    print(*send(s, msg, 1))
    if what == "replay":
        print(*send(s, msg, 2))
    s.close()


main()
