// tests/cli/serve_client.js — drives `rl-rollout serve` with the official
// `openai` npm client (NODE_PATH points at the cache tests/cli/serve_fetch.sh
// fills).  Usage: node serve_client.js BASE_URL API_KEY MODEL [tools]
// ("tools": only the tool checks, on a model with a Jinja chat template)
// Checks what the client itself parses and raises; prints "ok NAME" per
// check and exits 1 at the first failure.
'use strict';
const OpenAI = require('openai');
const assert = require('assert');

const [base, key, model, mode] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 60000 });

async function expectError(name, status, fn) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `${name}: not an APIError: ${e}`);
    assert.strictEqual(e.status, status, `${name}: status ${e.status}`);
    assert.ok(typeof e.message === 'string' && e.message.length > 0, `${name}: no message`);
    console.log(`ok ${name} (${e.status} ${e.type} ${e.code})`);
    return e;
  }
  throw new Error(`${name}: no error`);
}

async function main() {
  const models = await client.models.list();
  assert.deepStrictEqual(models.data.map((m) => m.id), [model]);
  console.log('ok models.list');

  const chat = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 6, n: 2, seed: 7, logprobs: true,
  });
  assert.strictEqual(chat.object, 'chat.completion');
  assert.strictEqual(chat.choices.length, 2);
  for (const c of chat.choices) {
    assert.strictEqual(c.message.role, 'assistant');
    assert.strictEqual(typeof c.message.content, 'string');
    assert.ok(['stop', 'length'].includes(c.finish_reason));
    assert.ok(c.logprobs.content.length >= 1);
    for (const t of c.logprobs.content) assert.ok(t.logprob <= 0 && Array.isArray(t.bytes));
  }
  const gen = chat.choices.reduce((a, c) => a + c.logprobs.content.length, 0);
  assert.strictEqual(chat.usage.completion_tokens, gen);
  assert.strictEqual(chat.usage.total_tokens, chat.usage.prompt_tokens + gen);
  console.log('ok chat.completions n=2 logprobs usage');

  // the same seed and settings give the same answer
  const again = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 6, n: 2, seed: 7, logprobs: true,
  });
  assert.deepStrictEqual(again.choices.map((c) => c.message.content), chat.choices.map((c) => c.message.content));
  console.log('ok seed reproducible');

  const cmpl = await client.completions.create({ model, prompt: 'abc', max_tokens: 5, temperature: 0, logprobs: 0 });
  assert.strictEqual(cmpl.object, 'text_completion');
  assert.strictEqual(cmpl.choices[0].logprobs.token_logprobs.length, cmpl.usage.completion_tokens);
  assert.strictEqual(cmpl.usage.prompt_tokens, 3);
  console.log('ok completions greedy logprobs');

  // top log-probs: N entries a position, likeliest first, the greedy token the first of them
  const top = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 3,
  });
  for (const t of top.choices[0].logprobs.content) {
    assert.strictEqual(t.top_logprobs.length, 3);
    for (let k = 1; k < 3; k++) assert.ok(t.top_logprobs[k].logprob <= t.top_logprobs[k - 1].logprob);
    assert.ok(Math.abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4);
    assert.ok(Array.isArray(t.top_logprobs[0].bytes));
  }
  const ctop = await client.completions.create({ model, prompt: 'abc', max_tokens: 3, temperature: 0, logprobs: 2 });
  assert.strictEqual(ctop.choices[0].logprobs.top_logprobs.length, ctop.usage.completion_tokens);
  for (const d of ctop.choices[0].logprobs.top_logprobs) assert.ok(Object.keys(d).length >= 1 && Object.keys(d).length <= 2);
  console.log('ok top_logprobs');

  // streaming: the deltas put together are the greedy answer given whole
  const stream = await client.completions.create({ model, prompt: 'abc', max_tokens: 5, temperature: 0, stream: true });
  let text = '', fin = null;
  for await (const ch of stream) {
    assert.strictEqual(ch.object, 'text_completion');
    text += ch.choices[0].text;
    if (ch.choices[0].finish_reason) fin = ch.choices[0].finish_reason;
  }
  assert.strictEqual(text, cmpl.choices[0].text);
  assert.strictEqual(fin, cmpl.choices[0].finish_reason);
  console.log('ok completions stream = whole');

  const cs = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 6, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let ctext = '', role = null, usage = null, cfin = null;
  for await (const ch of cs) {
    assert.strictEqual(ch.object, 'chat.completion.chunk');
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) ctext += c.delta.content;
      if (c.finish_reason) cfin = c.finish_reason;
    }
  }
  const whole = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 6, temperature: 0,
  });
  assert.strictEqual(role, 'assistant');
  assert.strictEqual(ctext, whole.choices[0].message.content);
  assert.strictEqual(cfin, whole.choices[0].finish_reason);
  assert.strictEqual(usage.completion_tokens, whole.usage.completion_tokens);
  console.log('ok chat stream = whole, usage chunk');

  await expectError('unknown model', 404, () => client.chat.completions.create({
    model: 'no-such-model', messages: [{ role: 'user', content: 'hi' }] }));
  const e = await expectError('bad field', 400, () => client.completions.create({ model, prompt: 'a', temperature: 7 }));
  assert.strictEqual(e.param, 'temperature');
  await expectError('tools without a template', 400, () => client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'hi' }],
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }] }));
  const bad = new OpenAI({ baseURL: base, apiKey: key + 'x', maxRetries: 0 });
  if (key !== 'none') await expectError('wrong key', 401, () => bad.models.list());
}

// A tool round trip as an agent writes it: tools offered, the earlier call and
// its result sent back in the client's own types; the answer parsed by the
// client, streamed and whole.
async function toolsMain() {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const messages = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'get_weather', arguments: JSON.stringify({ city: 'Paris' }) } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' },
  ];
  const r = await client.chat.completions.create({ model, messages, tools, tool_choice: 'auto', max_tokens: 4,
    temperature: 0 });
  const m = r.choices[0].message;
  assert.ok(Array.isArray(m.tool_calls), 'tool_calls is a list');
  for (const tc of m.tool_calls) {
    assert.strictEqual(tc.type, 'function');
    JSON.parse(tc.function.arguments);
  }
  assert.strictEqual(r.choices[0].finish_reason, m.tool_calls.length ? 'tool_calls' : 'length');
  console.log(`ok tools call (${m.tool_calls.length} calls)`);
  const st = await client.chat.completions.create({ model, messages, tools, max_tokens: 4, temperature: 0,
    stream: true });
  let text = '', fin = null;
  for await (const ch of st) {
    for (const c of ch.choices) {
      if (c.delta.content) text += c.delta.content;
      if (c.finish_reason) fin = c.finish_reason;
    }
  }
  assert.strictEqual(text, m.content ?? '');
  assert.strictEqual(fin, r.choices[0].finish_reason);
  console.log('ok tools stream = whole');
  const e = await expectError('tool_choice required', 400, () => client.chat.completions.create({
    model, messages, tools, tool_choice: 'required' }));
  assert.strictEqual(e.param, 'tool_choice');
}

(mode === 'tools' ? toolsMain() : main()).catch((e) => { console.error('FAIL', e && e.stack ? e.stack : e); process.exit(1); });
