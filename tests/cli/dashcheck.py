"""dashcheck.py FED.html EMPTY.html FED.png — reads what headless Chromium
left of the dashboard (rl-queue-dashboard.bats): the DOM of a page fed by a
short pipeline and of an empty broker's page (each canvas's data-points,
data-axes and data-ink, the body's data-rows and data-unfilled-rows), and a
screenshot of the fed page (a PNG decoded here with zlib: its size and how
many colours it holds).  Prints "ok ..." or fails an assertion."""
import re
import struct
import sys
import zlib


def canvases(path):
    html = open(path).read()
    st = re.search(r'id="status"[^>]*>([^<]*)<', html).group(1)
    assert st.startswith("updated"), (path, st)
    assert "display: block" not in re.search(r"<div id=\"nochart\"[^>]*>", html).group(0), "charts are off: " + path
    out = {}
    for tag in re.findall(r"<canvas[^>]*>", html):
        a = dict(re.findall(r'([a-z-]+)="([^"]*)"', tag))
        axes = {}
        for ax in a.get("data-axes", "").split(";"):
            if ax:
                k, title, ticks = ax.split(":")
                axes[k] = (title, int(ticks))
        out[a["id"]] = (int(a.get("data-points", "-1")), int(a.get("data-ink", "-1")), axes)
    body = dict(re.findall(r'([a-z-]+)="([^"]*)"', re.search(r"<body[^>]*>", html).group(0)))
    return html, out, body


def png_colours(path):
    png = open(path, "rb").read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    w, h, depth, ctype = struct.unpack(">IIBB", png[16:26])
    assert w >= 1000 and h >= 1000 and depth == 8 and ctype in (2, 6), (w, h, depth, ctype)
    data, pos = b"", 8
    while pos < len(png):
        n, kind = struct.unpack(">I4s", png[pos:pos + 8])
        if kind == b"IDAT":
            data += png[pos + 8:pos + 8 + n]
        pos += 12 + n
    raw, bpp = zlib.decompress(data), 3 if ctype == 2 else 4
    stride, prev, colours = w * bpp, bytearray(w * bpp), set()
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if y % 4 == 0:
            for x in range(0, w, 3):
                colours.add(bytes(line[x * bpp:x * bpp + 3]))
        prev = line
    return w, h, len(colours)


fed_html, fed, body = canvases(sys.argv[1])
_, empty, _ = canvases(sys.argv[2])
assert len(fed) == 14, sorted(fed)
# a fixed K: the --max-staleness auto card is hidden, its chart empty
assert re.search(r'<div class="card" id="card_autok" style="display: none;">', fed_html), "the auto K card shows"
assert fed["c_autok"][0] == 0 and empty["c_autok"][0] == 0, (fed["c_autok"], empty["c_autok"])
curves = ("c_reward", "c_len", "c_kl", "c_entropy", "c_step_s")
for c in curves + ("c_stage", "c_heat", "c_util", "c_rate", "c_ver", "c_stale"):
    assert fed[c][0] > 0, (c, "no data drawn", fed[c])
for c in curves + ("c_stage", "c_heat", "c_util"):
    assert empty[c][0] == 0, (c, "the empty broker has no data", empty[c])
    # coloured pixels in the plot area: the data drawn (grid and axes are grey)
    assert empty[c][1] == 0 and fed[c][1] > 50, (c, fed[c][:2], empty[c][:2])
for c in curves:
    # the trainer's curves against the step, both axes titled, with ticks
    assert fed[c][2]["x"][0] == "trainer step" and fed[c][2]["x"][1] >= 2, (c, fed[c][2])
    assert fed[c][2]["y"][0] and fed[c][2]["y"][1] >= 2, (c, fed[c][2])
assert fed["c_heat"][2]["x"][0] == "run time (s)", fed["c_heat"][2]
assert fed["c_util"][0] >= 3 * 2, fed["c_util"]      # three workers, two reports or more each
for wk in ("gen-1", "score-1", "learn-1"):
    assert ">%s<" % wk in fed_html, wk
# laid out without gaps: every row of cards but the last spans the grid
assert int(body["data-rows"]) > 1 and body["data-unfilled-rows"] == "0", body
w, h, n = png_colours(sys.argv[3])
assert n > 200, ("too few colours for a page of charts", n)
print("ok", {k: v[:2] for k, v in fed.items()}, "screenshot %dx%d, %d colours" % (w, h, n))
