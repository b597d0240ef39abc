// bench/serve_load.js — load for `rl-rollout serve`: C concurrent clients,
// each sending R streamed completions one after the other (Node's own fetch,
// no package).  Prints one JSON line: requests, tokens, wall seconds, tokens/s,
// time to first token (first event) and whole-request latency, p50 and p90.
// Usage: node bench/serve_load.js BASE_URL MODEL C R MAX_TOKENS [STREAM]
// (STREAM 0: whole answers; time to first token is then the latency)
'use strict';
const [base, model, C, R, maxTok, streamArg] = process.argv.slice(2);
const stream = streamArg !== '0';
const nc = +C, nr = +R, mt = +maxTok;

async function one(client, i) {
  const t0 = performance.now();
  const res = await fetch(`${base}/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model, prompt: `client ${client} request ${i}: `, max_tokens: mt,
      temperature: 1, seed: client * 1000 + i, stream, ...(stream ? { stream_options: { include_usage: true } } : {}) }),
  });
  if (res.status !== 200) throw new Error(`status ${res.status}: ${await res.text()}`);
  if (!stream) {
    const j = await res.json();
    const t = performance.now() - t0;
    return { ttft: t, total: t, tokens: j.usage.completion_tokens };
  }
  let ttft = null, tokens = 0, buf = '';
  const dec = new TextDecoder();
  for await (const part of res.body) {
    if (ttft === null) ttft = performance.now() - t0;
    buf += dec.decode(part, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.usage) tokens = j.usage.completion_tokens;
    }
  }
  return { ttft, total: performance.now() - t0, tokens };
}

function pct(a, p) {
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
}

async function main() {
  const res = [];
  const t0 = performance.now();
  await Promise.all([...Array(nc).keys()].map(async (c) => {
    for (let i = 0; i < nr; i++) res.push(await one(c, i));
  }));
  const wall = (performance.now() - t0) / 1000;
  const tokens = res.reduce((a, r) => a + r.tokens, 0);
  const r3 = (x) => Math.round(x * 1000) / 1000;
  console.log(JSON.stringify({
    bench: 'serve', stream, clients: nc, requests: res.length, max_tokens: mt, tokens, wall_s: r3(wall),
    tokens_per_s: Math.round(tokens / wall),
    ttft_p50_ms: r3(pct(res.map((r) => r.ttft), 0.5)), ttft_p90_ms: r3(pct(res.map((r) => r.ttft), 0.9)),
    latency_p50_ms: r3(pct(res.map((r) => r.total), 0.5)), latency_p90_ms: r3(pct(res.map((r) => r.total), 0.9)),
  }));
}
main().catch((e) => { console.error(e); process.exit(1); });
