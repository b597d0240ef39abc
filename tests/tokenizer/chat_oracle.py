#!/usr/bin/env python3
"""chat_oracle.py TOKENIZER_CONFIG CHATS -- render each chat (one JSON array of
messages per line of CHATS) with the model's own Jinja chat_template from
tokenizer_config.json, the way transformers renders it (sandboxed Jinja,
trim_blocks, lstrip_blocks, add_generation_prompt=True), and print one JSON
string per line.  Needs the jinja2 module; exits 77 without it."""
import json
import sys

try:
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("chat_oracle.py: python module jinja2 not found", file=sys.stderr)
    sys.exit(77)


def main():
    cfg = json.load(open(sys.argv[1], encoding="utf-8"))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    env.globals["raise_exception"] = lambda msg: (_ for _ in ()).throw(ValueError(msg))
    tpl = env.from_string(cfg["chat_template"])
    for line in open(sys.argv[2], encoding="utf-8"):
        msgs = json.loads(line)
        text = tpl.render(messages=msgs, add_generation_prompt=True, tools=None,
                          bos_token=cfg.get("bos_token") or "", eos_token=cfg.get("eos_token") or "")
        print(json.dumps(text, ensure_ascii=False))


if __name__ == "__main__":
    main()
