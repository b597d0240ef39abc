#!/usr/bin/env python3
"""A fake OpenAI-compatible judge for rl-reward-judge.bats (standard library only).

Serves GET /v1/models and POST /v1/chat/completions on 127.0.0.1:PORT (argv[1]);
prints the port it bound (argv[1] 0: any) and appends each request's user message
to argv[2].  The reply's content depends on that message:
  a line "RESPONSE: <text>"  -> "Reasoning...\\nScore: <len(text)>"  (the verdict)
  "GARBAGE"                  -> text without any number
  "FAIL500"                  -> HTTP 500 with an OpenAI-shaped error
  "HANG"                     -> no answer for 30 s
  "BADJSON"                  -> 200 with a body that is not JSON
"""
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, code, body):
        b = body.encode() if isinstance(body, str) else body
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self):
        if self.path == "/v1/models":
            self.send(200, json.dumps({"object": "list", "data": [{"id": "fake-judge", "object": "model"}]}))
        else:
            self.send(404, "{}")

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        req = json.loads(self.rfile.read(n))
        msg = req["messages"][0]["content"]
        with open(sys.argv[2], "a") as f:
            f.write(json.dumps({"model": req["model"], "auth": self.headers.get("Authorization"),
                                "temperature": req.get("temperature"), "max_tokens": req.get("max_tokens"),
                                "content": msg}) + "\n")
        if "HANG" in msg:
            time.sleep(30)
            return
        if "FAIL500" in msg:
            self.send(500, json.dumps({"error": {"message": "boom", "type": "server_error"}}))
            return
        if "BADJSON" in msg:
            self.send(200, "not json at all")
            return
        text = "I cannot judge this." if "GARBAGE" in msg else None
        if text is None:
            resp = [l for l in msg.split("\n") if l.startswith("RESPONSE: ")][0][len("RESPONSE: "):]
            text = "Reasoning: 3 points for style.\nScore: %d" % len(resp)
        self.send(200, json.dumps({"id": "x", "object": "chat.completion", "model": req["model"],
                                   "choices": [{"index": 0, "finish_reason": "stop",
                                                "message": {"role": "assistant", "content": text}}]}))


srv = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
srv.daemon_threads = True
print(srv.server_address[1], flush=True)
srv.serve_forever()
