"""A webhook receiver for the notification tests: ``python notify_receiver.py ADDR PORT OUT``.

Listens on ADDR:PORT (0: any free port), prints ``listening PORT PID`` once it accepts, and appends
one JSON line per POST to OUT: the time it arrived, the path (with its query) and the body.
Answers 500 to the first N POSTs when RECEIVER_FAIL_FIRST=N (to exercise retries)."""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

addr, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
fail_first = int(os.environ.get("RECEIVER_FAIL_FIRST", "0"))
seen = {"posts": 0}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        at = time.time()
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        seen["posts"] += 1
        if seen["posts"] <= fail_first:
            self.send_response(500)
            self.end_headers()
            return
        with open(out, "a") as f:
            f.write(json.dumps({"received": at, "path": self.path,
                                "content_type": self.headers.get("Content-Type"),
                                "body": json.loads(body)}) + "\n")
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


server = ThreadingHTTPServer((addr, port), Handler)
print(f"listening {server.server_address[1]} {os.getpid()}", flush=True)
server.serve_forever()
