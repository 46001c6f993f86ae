"""A stand-in for ``kubeinfer-runtime serve`` used by the localpods tests (stdlib only).

Accepts ``serve --config PATH --port P --host H [...]``; serves ``/v2/health/ready`` (200 once
``FAKE_RUNTIME_READY_DELAY`` seconds passed), ``/config`` (the config file's current text) and
``/metrics``: the runtime's metric names with an overloaded service's values (20 requests/s, every
one between 0.1 s and 0.5 s, utilization 0.95, 3 queued), so an autoscaler reading them scales out.
Exits 0 on SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("command")
    ap.add_argument("--config", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    args, _ = ap.parse_known_args()
    ready_at = time.monotonic() + float(os.environ.get("FAKE_RUNTIME_READY_DELAY", "0.3"))
    config = Path(args.config)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/v2/health/ready":
                code, body = (200, b"") if time.monotonic() >= ready_at else (503, b"")
            elif self.path == "/config":
                code, body = 200, config.read_bytes()
            elif self.path == "/metrics":
                code, body = 200, metrics().encode()
            else:
                code, body = 404, b""
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    started = time.monotonic()

    def metrics() -> str:
        n = int(20 * (time.monotonic() - started))
        m = 'model="minilm"'
        return "\n".join(
            [
                f'kubeinfer_request_duration_seconds_bucket{{{m},le="0.1"}} 0',
                f'kubeinfer_request_duration_seconds_bucket{{{m},le="0.5"}} {n}',
                f'kubeinfer_request_duration_seconds_bucket{{{m},le="+Inf"}} {n}',
                f"kubeinfer_request_duration_seconds_count{{{m}}} {n}",
                f"kubeinfer_request_duration_seconds_sum{{{m}}} {0.4 * n}",
                f'kubeinfer_requests_total{{{m},code="200"}} {n}',
                f"kubeinfer_queue_size{{{m}}} 3",
                f"kubeinfer_device_utilization_ratio{{{m}}} 0.95",
                "",
            ]
        )

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"fake runtime on {args.host}:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
