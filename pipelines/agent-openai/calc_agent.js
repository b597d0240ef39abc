// pipelines/agent-openai/calc_agent.js — the calculator task of
// pipelines/agent as an agent written against the official `openai`
// JavaScript client: run by `rl-rollout serve --agent`, one process per
// episode (NODE_PATH must reach the `openai` package; see README.md).
//
// The client reads OPENAI_BASE_URL and OPENAI_API_KEY from the environment;
// OPENAI_MODEL and RL_EPISODE_ID come from the server too, the prompt line
// ({"prompt": "123+456=", "a": 123, "b": 456}) on stdin.  Each turn is a
// completion of the text so far with the header X-Episode-Id, judged as
// pipelines/agent/calc_env.py judges it (the text with the stop string it
// ended on, read from the answer's log-prob tokens): "ANSWER: N" ends the
// episode, reward 1 when N = a + b; <calc>EXPR</calc> gets the value
// appended; anything else the reminder.  The reward is printed as the last
// line of stdout ({"reward": R}), the server's other way to take it.
// AGENT_TEMPERATURE, AGENT_MAX_TURNS (3) and AGENT_MAX_EPISODE_TOKENS (72)
// tune it, as in calc_agent.py.
'use strict';
const OpenAI = require('openai');

const CALL = /<calc>\s*([-+*0-9 ()]{1,64}?)\s*<\/calc>/;
const ANSWER = /ANSWER:\s*(-?\d+)/;

// digits, + - * ( ) and spaces only (checked by CALL): nothing else can run
function evaluate(expr) {
  try {
    return String(Function('"use strict"; return (' + expr + ');')());
  } catch (e) {
    return 'error';
  }
}

async function readLine() {
  let data = '';
  for await (const chunk of process.stdin) {
    data += chunk;
    if (data.includes('\n')) break;
  }
  return JSON.parse(data.split('\n')[0]);
}

async function main() {
  const line = await readLine();
  const want = Number(line.a) + Number(line.b);
  const client = new OpenAI({ maxRetries: 0, timeout: 120000,
    defaultHeaders: { 'X-Episode-Id': process.env.RL_EPISODE_ID } });
  const budget = Number(process.env.AGENT_MAX_EPISODE_TOKENS || 72);
  // logprobs: the answer's tokens, the stop string among them, tell which stop ended it
  const params = { model: process.env.OPENAI_MODEL, stop: ['</calc>', '\n'], logprobs: 0 };
  if (process.env.AGENT_TEMPERATURE) params.temperature = Number(process.env.AGENT_TEMPERATURE);
  let text = line.prompt;
  let reward = 0;
  let first = null;
  let seen = 0;
  for (let turn = 0; turn < Number(process.env.AGENT_MAX_TURNS || 3); turn++) {
    // the episode's tokens after the first prompt stay within the budget
    const used = first === null ? 0 : seen - first;
    if (used >= budget) break;
    let out;
    try {
      out = await client.completions.create({ ...params, prompt: text, max_tokens: Math.min(24, budget - used) });
    } catch (e) {
      // the context is full (400): the episode ends here, unrewarded by the task
      if (e instanceof OpenAI.BadRequestError) {
        process.stderr.write(`calc_agent.js: ${e.message}\n`);
        break;
      }
      throw e;
    }
    const choice = out.choices[0];
    seen = out.usage.prompt_tokens + out.usage.completion_tokens;
    if (first === null) first = out.usage.prompt_tokens;
    // the turn as calc_env.py sees it: the text and the stop string it ended on
    const after = choice.logprobs.tokens.join('').slice(choice.text.length);
    const stop = ['</calc>', '\n'].find((x) => after.startsWith(x)) || '';
    const act = choice.text + stop;
    const a = ANSWER.exec(act);
    if (a) {
      reward = Number(a[1]) === want ? 1 : 0;
      break;
    }
    const c = CALL.exec(act);
    text += act + (c ? evaluate(c[1]) : 'Use <calc>EXPR</calc> or write ANSWER: N.');
  }
  process.stdout.write(JSON.stringify({ reward }) + '\n');
}

main().catch((e) => {
  process.stderr.write(`calc_agent.js: ${e.stack || e}\n`);
  process.exit(1);
});
