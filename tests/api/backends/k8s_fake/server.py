"""The fake cluster over real HTTP on 127.0.0.1, shaped like the Kubernetes API server.

Paths `/api/v1/namespaces/{ns}/{plural}[/{name}[/log]]` and
`/apis/{apps,batch,networking.k8s.io}/v1/namespaces/{ns}/{plural}[/{name}]`; GET (get, list,
watch), POST (create), PATCH (merge patch), DELETE (gracePeriodSeconds, propagationPolicy as
query or DeleteOptions body). Errors are Status objects; watches are chunked newline-delimited
JSON events that end at timeoutSeconds, and an ERROR event with a 410 Status when the requested
version was compacted.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tests.api.backends.k8s_fake.cluster import FakeCluster, Request
from tests.api.backends.k8s_fake.store import KINDS, ApiError, Obj

ROUTE = re.compile(r"^/(?:api/v1|apis/(?P<group>apps|batch|networking\.k8s\.io)/v1)/"
                   r"namespaces/(?P<ns>[^/]+)/"
                   r"(?P<plural>[a-z]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>log))?)?$")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out as two writes; with Nagle's algorithm the second waits for the
    # client's delayed ACK, 40 ms on each request of a kept-alive connection.
    disable_nagle_algorithm = True
    server: FakeApiServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests read `cluster.requests` instead

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        query = dict(parse_qsl(url.query))
        length = int(self.headers.get("Content-Length") or 0)
        text = self.rfile.read(length) if length else b""
        try:
            body = json.loads(text) if text else None
        except ValueError:
            self._send(400, _status(ApiError(400, "BadRequest", "body is not JSON")))
            return
        cluster = self.server.cluster
        cluster.requests.append(Request(method, url.path, query, body))
        try:
            self._route(method, url.path, query, body)
        except ApiError as exc:
            self._send(exc.code, exc.status())

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> None:
        match = ROUTE.match(path)
        cluster = self.server.cluster
        plural = match.group("plural") if match else None
        if match is None or plural not in KINDS or \
                (KINDS[plural].group or None) != match.group("group"):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource "
                                            f"({method} {path})")
        ns, name, sub = match.group("ns"), match.group("name"), match.group("sub")
        if sub == "log" and method == "GET" and plural == "pods":
            tail = int(query["tailLines"]) if "tailLines" in query else None
            text = cluster.log(ns, name, query.get("previous") == "true", tail)
            self._send(200, text.encode(), "text/plain")
        elif name is None and method == "GET" and query.get("watch") in ("true", "1"):
            self._watch(plural, ns, query)
        elif name is None and method == "GET":
            with cluster.store.changed:
                items = cluster.store.items(plural, ns, query.get("labelSelector"))
                version = cluster.store.version
            self._send(200, {"kind": f"{KINDS[plural].kind}List",
                             "apiVersion": KINDS[plural].api_version,
                             "metadata": {"resourceVersion": str(version)}, "items": items})
        elif name is None and method == "POST":
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a JSON object is required")
            self._send(201, cluster.create(plural, ns, body))
        elif name is not None and sub is None and method == "GET":
            self._send(200, cluster.get(plural, ns, name))
        elif name is not None and sub is None and method == "PATCH":
            if self.headers.get("Content-Type") != "application/merge-patch+json":
                raise ApiError(415, "UnsupportedMediaType", "only merge patches are served")
            self._send(200, cluster.patch(plural, ns, name, body or {}))
        elif name is not None and sub is None and method == "DELETE":
            options = body if isinstance(body, dict) else {}
            grace = query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
            policy = query.get("propagationPolicy", options.get("propagationPolicy"))
            self._send(200, cluster.delete(plural, ns, name,
                                           None if grace is None else int(grace), policy))
        else:
            raise ApiError(405, "MethodNotAllowed", f"{method} {path} is not served")

    def _watch(self, plural: str, namespace: str, query: dict[str, str]) -> None:
        store, selector = self.server.cluster.store, query.get("labelSelector")
        deadline = time.monotonic() + int(query.get("timeoutSeconds", 1800))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        with store.changed:
            if "resourceVersion" in query and query["resourceVersion"] not in ("", "0"):
                sent = int(query["resourceVersion"])
                pending: list[tuple[str, Obj]] = []
            else:  # no version: the current objects first, as synthetic ADDED events
                sent = store.version
                pending = [("ADDED", obj) for obj in store.items(plural, namespace, selector)]
        while True:
            for type_, obj in pending:
                self._chunk({"type": type_, "object": obj})
            with store.changed:
                try:
                    events = store.events_after(sent, plural, namespace, selector)
                except ApiError as exc:
                    self._chunk({"type": "ERROR", "object": exc.status()})
                    break
                if not events:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self.server.stopping:
                        break
                    store.changed.wait(min(remaining, 0.5))
                    pending = []
                    continue
                sent = max(sent, events[-1].version)
                pending = [(e.type, e.object) for e in events]
        for type_, obj in pending:
            self._chunk({"type": type_, "object": obj})
        self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, event: Obj) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _send(self, code: int, body: Obj | bytes, content_type: str = "application/json",
              ) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _status(error: ApiError) -> Obj:
    return error.status()


class FakeApiServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up mid-watch (the backend closing) is not an error here

    def __init__(self, cluster: FakeCluster) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.cluster = cluster
        self.stopping = False
        self._thread = threading.Thread(target=self.serve_forever, name="fake-kube-apiserver",
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def write_kubeconfig(self, path: Path, namespace: str = "live-migrator") -> Path:
        """A kubeconfig for this server (the real client's own loading code reads it)."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester",
                                                      "namespace": namespace}}]}))
        return path

    def stop(self) -> None:
        self.stopping = True
        with self.cluster.store.changed:
            self.cluster.store.changed.notify_all()
        self.shutdown()
        self.server_close()
        self._thread.join(5)
        self.cluster.close()
