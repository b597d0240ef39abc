#!/usr/bin/env python3
"""gen_corpus.py [-n LINES] [-o FILE] -- write the tokenizer test corpus.

Deterministic (own splitmix64 generator, fixed seed): the same bytes on every
machine and Python version.  Records are arbitrary bytes (newlines included)
each ended by one NUL byte; no record contains NUL or U+FFFD.  Kinds: English,
code, numbers, long white space runs, emoji, CJK, mixed scripts with combining
marks (NFC), invalid UTF-8, special-token strings, random Unicode, long words.
"""
import argparse
import sys

MASK = (1 << 64) - 1


class Rng:
    def __init__(self, seed):
        self.s = seed & MASK

    def u64(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return self.u64() % n

    def pick(self, seq):
        return seq[self.below(len(seq))]

    def chance(self, p100):
        return self.below(100) < p100


WORDS = ("the of and to in is you that it he was for on are as with his they I at be this have from or "
         "one had by word but not what all were we when your can said there use an each which she do how "
         "their if will up other about out many then them these so some her would make like him into time "
         "has look two more write go see number no way could people my than first water been call who oil "
         "its now find long down day did get come made may part reinforcement learning policy gradient "
         "reward advantage tokenizer merges vocabulary Hello World OpenAI Qwen GPT transformer").split()
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL", "'D", "'x", "'",
                "'Sup", "'TIS", "'llama", "'dUNNO", "'very", "'Mm", "'rEally", "'2", "''s"]
PUNCT = list(".,;:!?-()[]{}\"'/\\@#$%^&*_+=<>|~`") + ["...", "--", "—", "–", "«", "»", "“", "”", "‘", "’", "¿", "¡"]
CODE = [
    "def f(x):\n    return x * 2\n", "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }", "if x != None and y >= 3:\n        pass",
    "{\"id\": 17, \"name\": \"rlpipe\", \"tags\": [\"a\", \"b\"], \"ok\": true}", "SELECT * FROM t WHERE a = 'b';",
    "const add = (a, b) => a + b; // arrow\r\n", "    \n\n    x = [i**2 for i in range(10)]\n\n\n",
    "<div class=\"x\">&nbsp;<br/></div>", "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "git commit -m 'fix: off-by-one in rl_bpe_merge()'", "$ ls -la /usr/lib | grep -c so\n",
    "\t\t\tif (rv != 0)\n\t\t\t\tgoto out;", "x=1;y=2;z=x+y;print(z)", "a_b_c __init__ self.__dict__",
]
EMOJI = ["😀", "😂", "🥲", "👍", "👍🏽", "❤️", "🔥", "🎉", "🇫🇷", "🇯🇵", "👨‍👩‍👧‍👦", "🧑🏻‍💻", "✅", "⭐", "🚀", "🌍",
         "☕", "🐍", "🤖", "💡", "1️⃣", "#️⃣", "🏳️‍🌈"]
CJK = ["你好，世界！", "强化学习是一种机器学习方法。", "今日は良い天気ですね。", "カタカナとひらがな", "東京都渋谷区",
       "안녕하세요 세계", "한국어 텍스트입니다", "中文、日本語、한국어。", "（括号）【方括号】「引号」", "一二三四五六七八九十"]
SCRIPTS = ["Привет, мир! Как дела?", "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก",
           "Tiếng Việt có dấu: Trường Đại học", "Ελληνικά και English mixed", "Ünïcödé ñ ç ß æ ø å", "ﬁ ﬂ ﬀ ligatures",
           "Ⅻ ⅷ ½ ¾ ² ³ ①②③", "Ｆｕｌｌｗｉｄｔｈ　ＡＳＣＩＩ", "ქართული ენა", "Հայերեն", "ᚠᛇᚻ᛫ᛒᛦᚦ"]
# decomposed forms: NFC must compose them (e + U+0301, Hangul jamo, ...)
COMBINING = ["e\u0301", "a\u0308", "o\u0302\u0323", "\u1100\u1161\u11a8", "\u1112\u1161\u11ab", "n\u0303",
             "A\u030a", "\u212b", "\u2126", "q\u0307\u0323", "\u0301\u0301x", "c\u0327", "\u0915\u093c"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "<|im_start|",
            "<|im_", "|>", "<|vision_pad|>", "<|fim_prefix|>", "<|endoftext|><|endoftext|>", "<<|im_end|>>"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2009", "\u2028", "\u000b", "\u000c", "\u0085", "\ufeff",
          "\u1680", "\u202f"]
# code point ranges assigned long ago (Unicode <= 12), so every engine classes them alike
RANGES = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x5ff), (0x600, 0x6ff),
          (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f), (0x2190, 0x23ff), (0x3040, 0x30ff),
          (0x4e00, 0x9fa5), (0xac00, 0xd7a3), (0xff00, 0xffef), (0x1f300, 0x1f5ff), (0x20000, 0x2a6d6)]


def english(r):
    out = []
    for _ in range(3 + r.below(25)):
        w = r.pick(WORDS)
        if r.chance(10):
            w = w.capitalize()
        if r.chance(5):
            w = w.upper()
        out.append(w)
        if r.chance(8):
            out[-1] += r.pick(CONTRACTIONS)
        if r.chance(12):
            out[-1] += r.pick(PUNCT)
    return " ".join(out) + r.pick([".", "!", "?", "", "\n", " "])


def numbers(r):
    parts = []
    for _ in range(1 + r.below(8)):
        k = r.below(7)
        if k == 0:
            parts.append(str(r.below(10 ** (1 + r.below(18)))))
        elif k == 1:
            parts.append("%d.%0*d" % (r.below(100000), 1 + r.below(6), r.below(100000)))
        elif k == 2:
            parts.append("{:,}".format(r.below(10 ** 12)))
        elif k == 3:
            parts.append("2026-%02d-%02dT%02d:%02d:%02dZ" % (1 + r.below(12), 1 + r.below(28), r.below(24), r.below(60), r.below(60)))
        elif k == 4:
            parts.append("+1 (%03d) %03d-%04d" % (r.below(1000), r.below(1000), r.below(10000)))
        elif k == 5:
            parts.append("".join(r.pick("0123456789") for _ in range(20 + r.below(60))))
        else:
            parts.append("%de-%d %s%d%%" % (r.below(10), r.below(30), r.pick(["$", "€", "¥", "£", "-", "x"]), r.below(1000)))
    return r.pick([" ", ", ", "; ", "\t", "\n", ""]).join(parts)


def spaces(r):
    out = []
    for _ in range(1 + r.below(6)):
        k = r.below(4)
        if k == 0:
            out.append(" " * (1 + r.below(300)))
        elif k == 1:
            out.append("".join(r.pick(SPACES) for _ in range(1 + r.below(40))))
        elif k == 2:
            out.append("\n" * (1 + r.below(10)) + " " * r.below(8))
        else:
            out.append(r.pick(WORDS))
    return "".join(out)


def soup(r):
    s = []
    for _ in range(1 + r.below(60)):
        a, b = r.pick(RANGES)
        s.append(chr(a + r.below(b - a + 1)))
    return "".join(s)


def mixed(r):
    gens = [english, numbers, lambda r: r.pick(CODE), lambda r: r.pick(EMOJI) * (1 + r.below(3)),
            lambda r: r.pick(CJK), lambda r: r.pick(SCRIPTS), lambda r: r.pick(COMBINING),
            lambda r: r.pick(SPECIALS), lambda r: r.pick(SPACES), soup]
    return "".join(r.pick(gens)(r) + r.pick(["", " ", "\n", ""]) for _ in range(2 + r.below(6)))


def long_word(r):
    k = r.below(4)
    n = 100 + r.below(400)
    if k == 0:
        return "a" * n
    if k == 1:
        return "".join(r.pick("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
    if k == 2:
        return "".join(r.pick(["ab", "ra", "ca", "da", "bra"]) for _ in range(n // 3))
    return "=" * n + "-" * (n // 2) + "!" * (n // 4)


def invalid(r, text):
    b = bytearray(text.encode("utf-8"))
    bad = [b"\x80", b"\xff", b"\xfe", b"\xc0\xaf", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf0\x9f",
           b"\xc3", b"\xe0\x80\x80", b"\xf5\x80", b"\xbf\xbf", b"\xc2\xc2", b"\xe4\xbd"]
    for _ in range(1 + r.below(4)):
        pos = r.below(len(b) + 1)
        b[pos:pos] = r.pick(bad)
    return bytes(b)


def record(r, i):
    k = i % 12
    if k == 0:
        return english(r)
    if k == 1:
        return r.pick(CODE) + ("\n" + r.pick(CODE) if r.chance(50) else "")
    if k == 2:
        return numbers(r)
    if k == 3:
        return spaces(r)
    if k == 4:
        return " ".join(r.pick(EMOJI) for _ in range(1 + r.below(10))) + r.pick(["", " ok", "!!"])
    if k == 5:
        return r.pick(CJK) + r.pick(["", " ", "\n"]) + r.pick(CJK)
    if k == 6:
        return r.pick(SCRIPTS) + " " + r.pick(COMBINING) + r.pick(SCRIPTS)
    if k == 7:
        return invalid(r, mixed(r))
    if k == 8:
        return r.pick(SPECIALS) + english(r) + r.pick(SPECIALS) + "\n" + r.pick(SPECIALS)
    if k == 9:
        return soup(r)
    if k == 10:
        return long_word(r) if i % 96 == 10 else mixed(r)
    return mixed(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", "--lines", type=int, default=12000)
    ap.add_argument("-o", "--output", default="-")
    a = ap.parse_args()
    r = Rng(0x726C70697065)  # "rlpipe"
    out = sys.stdout.buffer if a.output == "-" else open(a.output, "wb")
    for i in range(a.lines):
        rec = record(r, i)
        if isinstance(rec, str):
            rec = rec.encode("utf-8")
        assert b"\0" not in rec and "\ufffd".encode() not in rec
        out.write(rec + b"\0")
    out.flush()


if __name__ == "__main__":
    main()
