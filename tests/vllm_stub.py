"""A tiny HTTP server standing in for vLLM in the fast tests: it answers each
request with what `answer(method, path, body)` returns -- (status, JSON
object), or None to reset the connection without an answer."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StubVllm:
    def __init__(self, answer):
        self.answer, self.requests, self.errors = answer, [], []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                stub.requests.append((self.command, self.path, body))
                try:
                    reply = stub.answer(self.command, self.path, body)
                except AssertionError as e:           # an unexpected request: answer 599, remember why
                    stub.errors.append(str(e))
                    reply = (599, {"error": {"message": f"unexpected request: {e}"}})
                if reply is None:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                status, obj = reply
                raw = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _serve

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
