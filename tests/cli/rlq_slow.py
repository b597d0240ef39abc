"""rlq_slow.py — a hostile client of rl-queue serve for tests of --max-bytes:
opens N connections, declares on each a request of DECL_KIB KiB, sends
SEND_KIB KiB of it in 64 KiB pieces spread over a second, never the rest,
then holds the connections open for HOLD seconds and prints
"open N" (connections the broker had not closed).

  python3 rlq_slow.py tcp://127.0.0.1:PORT N DECL_KIB SEND_KIB HOLD
"""
import socket
import struct
import sys
import time

url, n, decl_kib, send_kib, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
host, port = url[len("tcp://"):].rsplit(":", 1)
socks = []
for i in range(n):
    try:
        s = socket.create_connection((host, int(port)), timeout=5)
        # SP handshake as a REQ peer (0x30), then the frame's 8-byte length and a request id
        s.sendall(b"\x00SP\x00" + struct.pack(">H", 0x30) + b"\x00\x00")
        s.sendall(struct.pack(">Q", decl_kib << 10) + struct.pack(">I", 0x80000001 + i))
        socks.append(s)
    except OSError:
        pass
piece = b"\0" * (64 << 10)
steps = max(1, send_kib // 64)
for k in range(steps):
    for s in list(socks):
        try:
            s.sendall(piece)
        except OSError:
            socks.remove(s)
    time.sleep(1.0 / steps)
end = time.time() + hold
while time.time() < end:
    time.sleep(0.1)
# a closed connection reads as end of file: count what is still open
alive = 0
for s in socks:
    s.setblocking(False)
    try:
        alive += s.recv(1) != b""
    except BlockingIOError:
        alive += 1
    except OSError:
        pass
print("open", alive, flush=True)
