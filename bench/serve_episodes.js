// bench/serve_episodes.js — multi-turn load for `rl-rollout serve`: C concurrent
// clients, each driving one episode (X-Episode-Id) of TURNS streamed completions:
// the prompt "task c:", then after each answer the answer's text and the
// observation "ok" appended, as rl-rollout --env's plain framing builds the
// same episode (bench/serve_episodes.sh runs both); the reward posted at the
// end.  Node's own fetch, no package.  Prints one JSON line: sampled tokens,
// wall seconds (first call to last reward), tokens/s, time to first token
// (first event carrying text or the finish) and call latency, p50 and p90.
// Usage: node bench/serve_episodes.js BASE_URL MODEL C TURNS TOKENS_PER_TURN
'use strict';
const [base, model, C, T, maxTok] = process.argv.slice(2);
const nc = +C, nt = +T, mt = +maxTok;

async function call(ep, prompt, seed) {
  const t0 = performance.now();
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-Episode-Id': ep },
    body: JSON.stringify({ model, prompt, max_tokens: mt, temperature: 1, seed, stream: true,
      stream_options: { include_usage: true } }),
  });
  if (res.status !== 200) throw new Error(`status ${res.status}: ${await res.text()}`);
  let ttft = null, tokens = 0, text = '', buf = '';
  const dec = new TextDecoder();
  for await (const part of res.body) {
    buf += dec.decode(part, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.usage) tokens = j.usage.completion_tokens;
      if (j.choices && j.choices.length) {
        if (ttft === null) ttft = performance.now() - t0;
        text += j.choices[0].text || '';
      }
    }
  }
  return { ttft, total: performance.now() - t0, tokens, text };
}

function pct(a, p) {
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
}

async function main() {
  const res = [];
  const t0 = performance.now();
  await Promise.all([...Array(nc).keys()].map(async (c) => {
    const ep = `ep-${c}`;
    let prompt = `task ${c}:`;
    for (let t = 0; t < nt; t++) {
      const r = await call(ep, prompt, c * 1000 + t);
      res.push(r);
      prompt += r.text + (t + 1 < nt ? 'ok' : '');
    }
    const rw = await fetch(`${base}/rl/episodes/${ep}/reward`, { method: 'POST', body: '{"reward": 1}' });
    if (rw.status !== 200) throw new Error(`reward: status ${rw.status}: ${await rw.text()}`);
  }));
  const wall = (performance.now() - t0) / 1000;
  const tokens = res.reduce((a, r) => a + r.tokens, 0);
  const r3 = (x) => Math.round(x * 1000) / 1000;
  console.log(JSON.stringify({
    clients: nc, turns: nt, tokens_per_turn: mt, calls: res.length, sampled: tokens, wall_s: r3(wall),
    sampled_s: Math.round(tokens / wall * 10) / 10,
    ttft_p50_ms: r3(pct(res.map((r) => r.ttft), 0.5)), ttft_p90_ms: r3(pct(res.map((r) => r.ttft), 0.9)),
    latency_p50_ms: r3(pct(res.map((r) => r.total), 0.5)), latency_p90_ms: r3(pct(res.map((r) => r.total), 0.9)),
    client_cpu_s: r3((process.cpuUsage().user + process.cpuUsage().system) / 1e6),
  }));
}
main().catch((e) => { console.error(e); process.exit(1); });
