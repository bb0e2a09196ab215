"""Heals: a joining pod fetches the live state (weights, optimizer, progress) from a peer.

torchft's HTTP checkpoint transport, made to trust nobody outside the job:
- its server listens on the pod's address only (torchft's listens on every interface);
- both ends prove they hold the job's peer secret (trainer.contract.credentials): the request
  carries a fresh nonce and its signature, and the reply the signature of the same nonce; the
  server serves no one else, and the healing pod reads no reply it cannot verify, so neither a
  stranger that reached the quorum nor any other server can hand it a state, and the secret
  itself never crosses the network;
- the state is loaded with `weights_only=True` (torchft unpickles it): tensors and plain
  values, as checkpoints are, so no payload can run code.

A heal sends the state in two parts, one after the other in the same response. The optimizer's
per-parameter state (AdamW's two moments: two thirds of a full fine-tune's heal) is needed only
for the update that ends the healing pod's first step: the pod loads the rest, starts computing
that step, and receives the optimizer's state meanwhile (trainer.train loads it before the
update). The source serves both parts under one read of its staged state, which it does not
change until its step commits (torchft's checkpoint lock), so both parts are of the same step.
The optimizer's part travels in threads scheduled below the step's own at both ends: where
cores are short, the shards of that step, which the source and the healing pod compute
meanwhile, come first.

Each part's tensors travel as raw bytes after it (`send_part`: the part carries an empty "meta"
tensor of the same dtype and shape in each one's place), and the healing pod reads each one
straight into its own tensor at the same place in its state, where there is one of that dtype
and shape: the weights land in the model's parameters, with no buffer to fill first and no copy
after (the load then finds them in place). A heal that breaks off after it wrote into the pod's
own weights has left them half one step's, half another's: the pod must end (`damaged`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_flatten_with_path, tree_leaves, tree_unflatten
from torchft.checkpointing import http_transport
from torchft.checkpointing._serialization import _streaming_load, _streaming_save
from torchft.checkpointing.http_transport import HTTPTransport

from trainer.contract import credentials
from trainer.listen import url_host

logger = logging.getLogger(__name__)

NONCE = "X-Heal-Nonce"
REQUEST_PROOF = "Authorization"
REPLY_PROOF = "X-Heal-Proof"
SCHEME = "Heal "
DEFERRED = ("user", "trainer", "trainer", "optimizer", "state")
"""Where torchft's state dict (its "user" part: trainer.train's live state) keeps the optimizer's
per-parameter state, sent after the rest."""
BACKGROUND_NICENESS = 10
"""How much less CPU than the step's own threads the optimizer's part gets at both ends, where
cores are short: it is needed only for the update that ends the healing pod's first step, and
the shards of that step, the healing pod's and its source's, come first."""


def in_background() -> None:
    """Schedule the calling thread below the process's others (Linux schedules each thread on
    its own niceness). An unprivileged thread cannot raise it back: only a thread that does
    nothing else may call it."""
    if sys.platform.startswith("linux"):
        thread = threading.get_native_id()
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, thread,
                           min(os.getpriority(os.PRIO_PROCESS, thread) + BACKGROUND_NICENESS, 19))


def deferred_in(state: dict[str, Any]) -> tuple[bool, Any]:
    """Whether `state` has the DEFERRED path, and what is there."""
    node: Any = state
    for key in DEFERRED:
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


def split_deferred(state: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """`state` with None where DEFERRED was, and what was there. Only the dicts along that path
    are copied: the staged state is left as it is. A state without that path: itself, and None."""
    found, deferred = deferred_in(state)
    return (replaced(state, DEFERRED, None), deferred) if found else (state, None)


def replaced(state: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A copy of `state` (of the dicts along `path` only) with `value` at `path`."""
    key, rest = path[0], path[1:]
    return {**state, key: replaced(state[key], rest, value) if rest else value}


def tensor_bytes(state: Any) -> int:
    return sum(leaf.numel() * leaf.element_size() for leaf in tree_leaves(state)
               if isinstance(leaf, torch.Tensor))


def send_part(state: Any, f: Any) -> None:
    """`state` with an empty meta tensor in place of each tensor (torch's streaming format, for
    the weights-only reader), then each tensor's bytes, in the same order."""
    leaves, spec = tree_flatten(state)
    tensors = [leaf.contiguous() for leaf in leaves if isinstance(leaf, torch.Tensor)]
    _streaming_save(tree_unflatten([torch.empty_like(leaf, device="meta")
                                    if isinstance(leaf, torch.Tensor) else leaf
                                    for leaf in leaves], spec), f)
    for tensor in tensors:
        if tensor.numel():
            f.write(memoryview(raw_bytes(tensor)))


def raw_bytes(tensor: torch.Tensor) -> Any:
    """A contiguous CPU tensor's memory, as a writable numpy array of bytes (any dtype)."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


def read_into(f: Any, tensor: torch.Tensor) -> None:
    """Fill `tensor` with its bytes from the stream `f`; ConnectionError if it ends first."""
    buffer, filled = memoryview(raw_bytes(tensor)), 0
    while filled < len(buffer):
        read = f.readinto(buffer[filled:])
        if not read:
            raise ConnectionError(f"the heal's stream ended {len(buffer) - filled} bytes short "
                                  f"of a tensor")
        filled += read


def destination(own: Any, placeholder: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Where the tensor `placeholder` stands for is read: into the pod's own (`own`, at the same
    place in its state) where that is a CPU tensor of its dtype and shape, else into new
    memory; and whether it is the pod's own."""
    if (isinstance(own, torch.Tensor) and own.device.type == "cpu" and own.is_contiguous()
            and own.dtype == placeholder.dtype and own.shape == placeholder.shape):
        return own, True
    return torch.empty_like(placeholder, device="cpu"), False


class UntrustedSource(ConnectionError):
    """The heal source did not prove it holds the job's secret: nothing it sent was read."""


class Transport(HTTPTransport[dict[str, Any]]):
    """Serves this pod's state to its job's peers at the pod's address; times each heal it takes.

    It advertises the pod's address too: torchft advertises the machine's host name, which
    peers on Kubernetes cannot resolve.
    """

    def __init__(self, host: str, secret: str, timeout: timedelta) -> None:
        self.secret = credentials.require(secret, "a live pod's heal server")
        self.host = url_host(host)
        self.last_heal: dict[str, Any] | None = None
        self.own_state: Callable[[], dict[str, Any]] = dict
        """This pod's state (torchft's state dict): a heal reads each tensor into the one at
        the same place where it fits (LiveGroup.register_state sets it)."""
        self.damaged = False
        """A heal broke off after writing into this pod's own tensors. (Where those were its
        optimizer's, the trainer fails first: that part of the heal did not arrive.)"""
        self._deferred = ThreadPoolExecutor(max_workers=1, thread_name_prefix="heal-deferred",
                                            initializer=in_background)
        # HTTPTransport.__init__ sets up its state and starts serving; the one server it builds
        # (on every interface, for anyone) is ours instead. Nothing else builds one meanwhile.
        original = http_transport._IPv6HTTPServer
        http_transport._IPv6HTTPServer = lambda address, handler: HealServer(host, self)
        try:
            super().__init__(timeout=timeout, num_chunks=0)
        finally:
            http_transport._IPv6HTTPServer = original
        logger.info("heal server listening on %s", self.address())

    def shutdown(self, wait: bool = True) -> None:
        super().shutdown(wait)
        self._deferred.shutdown(wait=wait)
        if wait:  # stopped serving: its socket can go too
            self._server.server_close()

    def address(self) -> str:
        port = self._server.socket.getsockname()[1]
        return f"http://{self.host}:{port}/checkpoint/"

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int,
                        timeout: timedelta) -> dict[str, Any]:
        started = time.perf_counter()
        url = f"{metadata}{step}/full"
        path = urllib.parse.urlsplit(url).path
        nonce = credentials.nonce()
        request = urllib.request.Request(url, headers={
            NONCE: nonce, REQUEST_PROOF: SCHEME + credentials.sign(self.secret, "heal", nonce,
                                                                   path)})
        response = urllib.request.urlopen(request, timeout=timeout.total_seconds())
        try:
            if not credentials.verify(response.headers.get(REPLY_PROOF), self.secret,
                                      "healed", nonce, path):
                raise UntrustedSource(f"the heal source at {metadata} did not prove it belongs "
                                      f"to this job: its state was not read")
            own = self.own_state()
            state = self._read_part(response, own)
        except BaseException:
            response.close()
            raise
        seconds = time.perf_counter() - started
        self.last_heal = {"bytes": tensor_bytes(state), "seconds": round(seconds, 3),
                          "source_address": metadata.split("/checkpoint/")[0]}
        deferred: Future[Any] = self._deferred.submit(
            self._receive_deferred, response, deferred_in(own)[1], started + seconds)
        return replaced(state, DEFERRED, deferred) if deferred_in(state)[0] else state

    def _read_part(self, response: Any, own_state: Any) -> Any:
        """A skeleton, then each of its tensors, read into the one at the same place in
        `own_state` where it fits."""
        paths_and_leaves, spec = tree_flatten_with_path(
            _streaming_load(response, weights_only=True))
        own = dict(tree_flatten_with_path(own_state)[0])
        leaves: list[Any] = []
        for path, leaf in paths_and_leaves:
            if isinstance(leaf, torch.Tensor) and leaf.device.type == "meta":
                tensor, in_place = destination(own.get(path), leaf)
                try:
                    read_into(response, tensor)
                except BaseException:
                    self.damaged = self.damaged or in_place
                    raise
                leaf = tensor
            leaves.append(leaf)
        return tree_unflatten(leaves, spec)

    def _receive_deferred(self, response: Any, own: Any, since: float) -> Any:
        """The optimizer's state, the second part of the heal's response (a Future of it is
        where it belongs in the state handed to the trainer), read into `own` (this pod's
        optimizer state, as it was when the heal began) where it fits."""
        with response:
            deferred = self._read_part(response, own)
        logger.info("heal: the optimizer's state arrived, %d bytes, %.2f s after the rest",
                    tensor_bytes(deferred), time.perf_counter() - since)
        return deferred


class HealServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # torchft's: every peer of a large job may heal at once

    def __init__(self, host: str, transport: Transport) -> None:
        self.address_family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
        self.transport = transport
        super().__init__((host, 0), HealHandler)


class HealHandler(BaseHTTPRequestHandler):
    """GET /checkpoint/<step>/full: the state staged for that step, to holders of the secret."""

    server: HealServer

    def setup(self) -> None:
        super().setup()
        # A stalled peer must not hold a server thread forever.
        self.connection.settimeout(self.server.transport._timeout.total_seconds())

    def do_GET(self) -> None:
        transport = self.server.transport
        nonce = self.headers.get(NONCE) or ""
        proof = self.headers.get(REQUEST_PROOF) or ""
        path = urllib.parse.urlsplit(self.path).path
        if not (0 < len(nonce) <= 100 and proof.startswith(SCHEME) and credentials.verify(
                proof.removeprefix(SCHEME), transport.secret, "heal", nonce, path)):
            logger.warning("heal request from %s refused: it did not prove it belongs to this "
                           "job", self.client_address[0])
            self.send_error(HTTPStatus.FORBIDDEN, "a heal needs this job's secret")
            return
        try:
            # Waits while no checkpoint is allowed (between steps), up to the timeout.
            with transport._checkpoint_lock.r_lock():
                expected = f"/checkpoint/{transport._step}/full"
                if self.path != expected:
                    self.send_error(HTTPStatus.BAD_REQUEST,
                                    f"serving {expected}, not {self.path}")
                    return
                self.send_response(HTTPStatus.OK)
                self.send_header(REPLY_PROOF, credentials.sign(transport.secret, "healed",
                                                               nonce, path))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                rest, deferred = split_deferred(transport._state_dict)
                send_part(rest, self.wfile)
                in_background()  # this request's thread, which ends with it
                send_part(deferred, self.wfile)
        except TimeoutError:
            self.send_error(HTTPStatus.SERVICE_UNAVAILABLE, "no checkpoint is being served")
        except OSError as exc:  # the peer went away mid-transfer
            logger.warning("heal of %s to %s broke off: %s", self.path, self.client_address[0],
                           exc)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("heal server: " + format, *args)
