#!/usr/bin/env python3
"""chat_oracle.py [--no-thinking] TOKENIZER_CONFIG CHATS -- render each chat
(one JSON array of messages per line of CHATS, or {"messages": [...],
"chat_template_kwargs": {...}}) with the model's own Jinja chat_template from
tokenizer_config.json, the way transformers renders it (sandboxed Jinja,
trim_blocks, lstrip_blocks, add_generation_prompt=True, the kwargs as
template variables; --no-thinking: enable_thinking=False where a line does
not say), and print one JSON string per line.  A content given as a list of
OpenAI content parts is first joined as vLLM joins the text parts for a
template that takes text ("\n" between them): Qwen's templates concatenate
the content as a string, so transformers itself fails on such a list.
Needs the jinja2 module; exits 77 without it."""
import json
import sys

try:
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("chat_oracle.py: python module jinja2 not found", file=sys.stderr)
    sys.exit(77)


def flatten(msgs):
    for m in msgs:
        if isinstance(m.get("content"), list):
            m["content"] = "\n".join(p if isinstance(p, str) else p["text"] for p in m["content"])
    return msgs


def main():
    args = sys.argv[1:]
    defaults = {}
    if args and args[0] == "--no-thinking":
        defaults["enable_thinking"] = False
        args = args[1:]
    cfg = json.load(open(args[0], encoding="utf-8"))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    env.globals["raise_exception"] = lambda msg: (_ for _ in ()).throw(ValueError(msg))
    tpl = env.from_string(cfg["chat_template"])
    for line in open(args[1], encoding="utf-8"):
        chat = json.loads(line)
        kw = dict(defaults)
        if isinstance(chat, dict):
            kw.update(chat.get("chat_template_kwargs") or {})
            chat = chat["messages"]
        text = tpl.render(messages=flatten(chat), add_generation_prompt=True, tools=None,
                          bos_token=token(cfg, "bos_token"), eos_token=token(cfg, "eos_token"), **kw)
        print(json.dumps(text, ensure_ascii=False))


def token(cfg, key):
    """A special token as transformers passes it: the string, or the
    "content" of an AddedToken object (DeepSeek V3's config has those)."""
    v = cfg.get(key) or ""
    return v.get("content", "") if isinstance(v, dict) else v


if __name__ == "__main__":
    main()
