"""A stand-in for the operator's progress endpoint on loopback, for tests of the runtime's
reporter: it keeps every report POSTed to it (with its Authorization header) and answers
each with the next code queued in ``answers`` (202 when none is queued). 429 and 503 carry
Retry-After, as the operator's do."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

# Seconds in Retry-After: the operator's 429 (budget) and 503 (standby, starting) answers.
RETRY_AFTER: Final = {429: "1", 503: "0"}


@dataclass
class Endpoint:
    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)


@contextmanager
def serving() -> Iterator[Endpoint]:
    endpoint = Endpoint()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            endpoint.received.append({"auth": self.headers.get("Authorization"), **body})
            code = endpoint.answers.pop(0) if endpoint.answers else 202
            self.send_response(code)
            if code in RETRY_AFTER:
                self.send_header("Retry-After", RETRY_AFTER[code])
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    endpoint.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1/x"
    try:
        yield endpoint
    finally:
        httpd.shutdown()
        httpd.server_close()
