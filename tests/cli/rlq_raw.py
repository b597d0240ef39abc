"""rlq_raw.py — a bare rl-queue client for tests: nng's REQ/REP over TCP
spoken by hand (SP handshake, 64-bit length prefix, REQ request id), so a
test can send the broker requests no real client would (malformed or
oversized reports).

  python3 rlq_raw.py tcp://127.0.0.1:PORT report FILE [zstd-claim N]
      sends FILE's bytes as a REPORT body (raw length N if given, else the
      size); prints "STATUS MESSAGE" of the reply
  python3 rlq_raw.py tcp://127.0.0.1:PORT version N
      sends a VERSION request with the argument N (any 64-bit value)
  python3 rlq_raw.py tcp://127.0.0.1:PORT put-stage N FILE
      sends FILE's bytes (a batch payload) as a PUT with stage argument N
"""
import socket
import struct
import sys

OP_PUT = 2
OP_VERSION = 5
OP_REPORT = 7


def _recvn(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise ConnectionError("closed by the broker")
        b += c
    return b


def call(url, op, body, flags=0, raw_len=None, arg=0):
    host, port = url[len("tcp://"):].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    try:
        s.sendall(b"\x00SP\x00" + struct.pack(">H", 0x30) + b"\x00\x00")   # REQ v0
        hs = _recvn(s, 8)
        assert hs[:4] == b"\x00SP\x00" and struct.unpack(">H", hs[4:6])[0] == 0x31, hs  # REP v0
        hdr = b"RLQP" + bytes([1, op]) + struct.pack("<HHHI", flags, 32, 0,
                                                     len(body) if raw_len is None else raw_len)
        hdr += struct.pack("<QQ", 7, arg)
        msg = struct.pack(">I", 0x80000001) + hdr + body
        s.sendall(struct.pack(">Q", len(msg)) + msg)
        n = struct.unpack(">Q", _recvn(s, 8))[0]
        rep = _recvn(s, n)[4:]
        assert rep[:4] == b"RLQP" and rep[5] == op | 0x80, rep[:8]
        hl = struct.unpack("<H", rep[8:10])[0]
        status = struct.unpack("<H", rep[10:12])[0]
        return status, rep[hl:].decode("utf-8", "replace")
    finally:
        s.close()


if __name__ == "__main__":
    url, what = sys.argv[1:3]
    if what == "version":
        print(*call(url, OP_VERSION, b"", arg=int(sys.argv[3])))
        sys.exit(0)
    if what == "put-stage":
        print(*call(url, OP_PUT, open(sys.argv[4], "rb").read(), arg=int(sys.argv[3])))
        sys.exit(0)
    path = sys.argv[3]
    assert what == "report"
    data = open(path, "rb").read()
    flags, raw = 0, None
    if len(sys.argv) > 5 and sys.argv[4] == "zstd-claim":
        flags, raw = 1, int(sys.argv[5])
    st, text = call(url, OP_REPORT, data, flags, raw)
    print(st, text)
