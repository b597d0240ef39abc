// pipelines/agent-openai/calc_agent.js — the calculator task of
// pipelines/agent as an agent written against the official `openai`
// JavaScript client: run by `rl-rollout serve --agent`, one process per
// episode (NODE_PATH must reach the `openai` package; see README.md).
//
// The client reads OPENAI_BASE_URL and OPENAI_API_KEY from the environment;
// OPENAI_MODEL and RL_EPISODE_ID come from the server too, the prompt line
// ({"prompt": "123+456=", "a": 123, "b": 456}) on stdin.  Each turn is a
// completion of the text so far with the header X-Episode-Id; a turn that
// opens <calc>EXPR (stopped at "</calc>") gets "</calc>" and the result
// appended, as pipelines/agent/calc_env.py answers; "ANSWER: N" ends the
// episode, reward 1 when N = a + b.  The reward is printed as the last line
// of stdout ({"reward": R}), the server's other way to take it.
// AGENT_TEMPERATURE and AGENT_MAX_TURNS (default 3) tune it.
'use strict';
const OpenAI = require('openai');

const CALC = /<calc>\s*([-+*0-9 ()]{1,64}?)\s*$/;
const ANSWER = /ANSWER:\s*(-?\d+)/;

// digits, + - * ( ) and spaces only (checked by CALC): nothing else can run
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
  const params = { model: process.env.OPENAI_MODEL, max_tokens: 24, stop: ['</calc>', '\n'] };
  if (process.env.AGENT_TEMPERATURE) params.temperature = Number(process.env.AGENT_TEMPERATURE);
  let text = line.prompt;
  let reward = 0;
  for (let turn = 0; turn < Number(process.env.AGENT_MAX_TURNS || 3); turn++) {
    let out;
    try {
      out = await client.completions.create({ ...params, prompt: text });
    } catch (e) {
      // the context is full (400): the episode ends here, unrewarded by the task
      if (e instanceof OpenAI.BadRequestError) {
        process.stderr.write(`calc_agent.js: ${e.message}\n`);
        break;
      }
      throw e;
    }
    const choice = out.choices[0];
    const a = ANSWER.exec(choice.text);
    if (a) {
      reward = Number(a[1]) === want ? 1 : 0;
      break;
    }
    const c = CALC.exec(choice.text);
    if (!c || choice.finish_reason !== 'stop') break;
    text += choice.text + '</calc>' + evaluate(c[1]);
  }
  process.stdout.write(JSON.stringify({ reward }) + '\n');
}

main().catch((e) => {
  process.stderr.write(`calc_agent.js: ${e.stack || e}\n`);
  process.exit(1);
});
