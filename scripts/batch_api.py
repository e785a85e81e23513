"""An emulator of OpenAI's Batch API over an OpenAI-compatible server (llama.cpp's), written from
OpenAI's documentation (https://platform.openai.com/docs/guides/batch and the API reference of
/v1/files and /v1/batches), for batchinfer's tests:

  POST /v1/files                  multipart: purpose=batch, file=<JSONL of requests>
  GET  /v1/files/{id}/content     the file's bytes (inputs, outputs, errors)
  POST /v1/batches                {input_file_id, endpoint, completion_window, metadata}
  GET  /v1/batches/{id}           the batch: status, request_counts, output_file_id, error_file_id
  GET  /v1/batches?limit=&after=  the batches, newest first
  POST /v1/batches/{id}/cancel
  POST /v1/chat/completions       passed to the server as it is (a model's requests one by one)

Each input line is {"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}; each
output line {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}; a
request that failed or was not run before its batch expired is a line of the error file, its
"error" {"code", "message"} (code "batch_expired" for the latter).

Its state (files, batches, counts) is kept in --state, so that it can be killed and started
again on the same folder and port: a batch in progress goes on where it was. Faults, each on the
first batch only: --fail-every N (every Nth request of it answered 500), --expire-first (it
expires after half of its requests ran), --hold (batches stay in progress until the file
<state>/release exists); and --refuse-output N (the first N reads of a batch's output file are
answered 404). GET /_counts: files, batches, lines (requests submitted), by custom_id
how many times each was submitted, and forwarded (requests the server ran).
"""

import http.client
import http.server
import json
import os
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

STATUSES_DONE = ("completed", "failed", "expired", "cancelled")


def batches(args, wait_for_stdin_to_close):
    state_dir = args.state
    os.makedirs(os.path.join(state_dir, "files"), exist_ok=True)
    state_path = os.path.join(state_dir, "state.json")
    lock = threading.RLock()
    upstream = args.upstream.rstrip("/").removeprefix("http://")
    host, port = upstream.split(":")
    if os.path.exists(state_path):
        with open(state_path) as f:
            state = json.load(f)
    else:
        state = {"files": {}, "batches": {}, "order": [], "counts": {
            "files": 0, "batches": 0, "lines": 0, "forwarded": 0, "by_custom_id": {}}}

    refused_reads = [0]

    def save():
        with lock:
            tmp = state_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(state, f)
            os.replace(tmp, state_path)

    def file_path(file_id):
        return os.path.join(state_dir, "files", file_id)

    def new_file(data, purpose, filename):
        file_id = "file-" + uuid.uuid4().hex[:24]
        with open(file_path(file_id), "wb") as f:
            f.write(data)
        meta = {"id": file_id, "object": "file", "bytes": len(data), "created_at": int(time.time()),
                "filename": filename, "purpose": purpose}
        with lock:
            state["files"][file_id] = meta
            state["counts"]["files"] += 1
        return meta

    def forward(line):
        conn = http.client.HTTPConnection(host, int(port), timeout=600)
        conn.request("POST", line.get("url", "/v1/chat/completions"), json.dumps(line["body"]),
                     {"Content-Type": "application/json"})
        reply = conn.getresponse()
        data = reply.read()
        with lock:
            state["counts"]["forwarded"] += 1
        return reply.status, json.loads(data)

    def run(batch_id):
        with lock:
            batch = state["batches"][batch_id]
            first = state["order"][0] == batch_id
            batch["status"] = "in_progress"
            batch.setdefault("in_progress_at", int(time.time()))
            save()
        while args.hold and not os.path.exists(os.path.join(state_dir, "release")):
            time.sleep(0.2)
        with open(file_path(batch["input_file_id"]), "rb") as f:
            lines = [json.loads(l) for l in f.read().splitlines() if l.strip()]
        done = batch.setdefault("done", {})
        expire_after = len(lines) // 2 if (first and args.expire_first) else None

        def one(index_line):
            index, line = index_line
            cid = line["custom_id"]
            if cid in done:
                return
            if expire_after is not None and index >= expire_after:
                return
            if first and args.fail_every and index % args.fail_every == args.fail_every - 1:
                result = {"id": "batch_req_" + uuid.uuid4().hex[:16], "custom_id": cid,
                          "response": {"status_code": 500, "request_id": uuid.uuid4().hex,
                                       "body": {"error": {"message": "injected failure",
                                                          "type": "server_error"}}},
                          "error": None}
            else:
                status, body = forward(line)
                result = {"id": "batch_req_" + uuid.uuid4().hex[:16], "custom_id": cid,
                          "response": {"status_code": status, "request_id": uuid.uuid4().hex,
                                       "body": body},
                          "error": None}
            with lock:
                done[cid] = result
                batch["request_counts"]["completed" if result["response"]["status_code"] == 200
                                        else "failed"] += 1
                save()

        with ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(one, enumerate(lines)))
        with lock:
            batch["status"] = "finalizing"
            outputs, errors = [], []
            for line in lines:
                cid = line["custom_id"]
                result = done.get(cid)
                if result is None:
                    errors.append({"id": "batch_req_" + uuid.uuid4().hex[:16], "custom_id": cid,
                                   "response": None,
                                   "error": {"code": "batch_expired",
                                             "message": "This request could not be executed "
                                                        "before the completion window expired."}})
                elif result["response"]["status_code"] == 200:
                    outputs.append(result)
                else:
                    errors.append(result)
            if outputs:
                batch["output_file_id"] = new_file(
                    "".join(json.dumps(o) + "\n" for o in outputs).encode(), "batch_output",
                    "batch_output.jsonl")["id"]
            if errors:
                batch["error_file_id"] = new_file(
                    "".join(json.dumps(e) + "\n" for e in errors).encode(), "batch_output",
                    "batch_errors.jsonl")["id"]
            if expire_after is not None:
                batch["status"] = "expired"
                batch["expired_at"] = int(time.time())
            else:
                batch["status"] = "completed"
                batch["completed_at"] = int(time.time())
            batch.pop("done", None)
            save()

    def worker():
        while True:
            with lock:
                todo = [b for b in state["order"]
                        if state["batches"][b]["status"] in ("validating", "in_progress")]
            if todo:
                run(todo[0])
            else:
                time.sleep(0.1)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_):
            pass

        def answer(self, status, body, content_type="application/json"):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def not_found(self):
            self.answer(404, {"error": {"message": f"no such thing: {self.path}",
                                        "type": "invalid_request_error"}})

        def do_GET(self):
            path, _, query = self.path.partition("?")
            if path == "/_counts":
                with lock:
                    return self.answer(200, state["counts"])
            m = re.fullmatch(r"/v1/files/([\w-]+)/content", path)
            if (m and state["files"].get(m.group(1), {}).get("purpose") == "batch_output"
                    and refused_reads[0] < args.refuse_output):
                refused_reads[0] += 1
                return self.not_found()
            if m:
                if m.group(1) not in state["files"]:
                    return self.not_found()
                with open(file_path(m.group(1)), "rb") as f:
                    return self.answer(200, f.read(), "application/octet-stream")
            m = re.fullmatch(r"/v1/batches/([\w-]+)", path)
            if m:
                with lock:
                    batch = state["batches"].get(m.group(1))
                    if batch is None:
                        return self.not_found()
                    return self.answer(200, {k: v for k, v in batch.items() if k != "done"})
            if path == "/v1/batches":
                params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
                limit = min(int(params.get("limit", "20")), 100)
                with lock:
                    ids = list(reversed(state["order"]))
                    if "after" in params and params["after"] in ids:
                        ids = ids[ids.index(params["after"]) + 1:]
                    page = [{k: v for k, v in state["batches"][b].items() if k != "done"}
                            for b in ids[:limit]]
                return self.answer(200, {"object": "list", "data": page,
                                         "first_id": page[0]["id"] if page else None,
                                         "last_id": page[-1]["id"] if page else None,
                                         "has_more": len(ids) > limit})
            self.not_found()

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            path = self.path.partition("?")[0]
            if path == "/v1/files":
                return self.upload(body)
            if path == "/v1/batches":
                request = json.loads(body)
                file_id = request.get("input_file_id")
                if file_id not in state["files"]:
                    return self.answer(400, {"error": {"message": f"no file {file_id}",
                                                       "type": "invalid_request_error"}})
                with open(file_path(file_id), "rb") as f:
                    lines = [json.loads(l) for l in f.read().splitlines() if l.strip()]
                batch_id = "batch_" + uuid.uuid4().hex[:24]
                batch = {"id": batch_id, "object": "batch", "endpoint": request.get("endpoint"),
                         "errors": None, "input_file_id": file_id,
                         "completion_window": request.get("completion_window", "24h"),
                         "status": "validating", "output_file_id": None, "error_file_id": None,
                         "created_at": int(time.time()),
                         "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
                         "metadata": request.get("metadata")}
                with lock:
                    state["batches"][batch_id] = batch
                    state["order"].append(batch_id)
                    counts = state["counts"]
                    counts["batches"] += 1
                    counts["lines"] += len(lines)
                    for line in lines:
                        cid = line["custom_id"]
                        counts["by_custom_id"][cid] = counts["by_custom_id"].get(cid, 0) + 1
                    save()
                return self.answer(200, batch)
            m = re.fullmatch(r"/v1/batches/([\w-]+)/cancel", path)
            if m:
                with lock:
                    batch = state["batches"].get(m.group(1))
                    if batch is None:
                        return self.not_found()
                    if batch["status"] not in STATUSES_DONE:
                        batch["status"] = "cancelled"
                    save()
                    return self.answer(200, {k: v for k, v in batch.items() if k != "done"})
            if path == "/v1/chat/completions":
                status, reply = forward({"url": path, "body": json.loads(body)})
                return self.answer(status, reply)
            self.not_found()

        def upload(self, body):
            match = re.search(r"boundary=\"?([^\";]+)\"?", self.headers.get("Content-Type", ""))
            if not match:
                return self.answer(400, {"error": {"message": "expected multipart/form-data"}})
            boundary = b"--" + match.group(1).encode()
            fields, data, filename = {}, None, "input.jsonl"
            for part in body.split(boundary)[1:]:
                if part.startswith(b"--"):
                    break
                head, _, content = part.partition(b"\r\n\r\n")
                content = content[:-2] if content.endswith(b"\r\n") else content
                name = re.search(rb'name="([^"]*)"', head)
                if not name:
                    continue
                if name.group(1) == b"file":
                    data = content
                    fn = re.search(rb'filename="([^"]*)"', head)
                    if fn:
                        filename = fn.group(1).decode()
                else:
                    fields[name.group(1).decode()] = content.decode()
            if data is None or fields.get("purpose") != "batch":
                return self.answer(400, {"error": {"message": "expected purpose=batch and a file"}})
            for line in data.splitlines():
                if line.strip():
                    json.loads(line)["custom_id"]
            meta = new_file(data, "batch", filename)
            save()
            self.answer(200, meta)

    threading.Thread(target=worker, daemon=True).start()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print("ready", flush=True)
    wait_for_stdin_to_close()
    server.serve_forever()
