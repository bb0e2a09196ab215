"""The job's key-value stores, for its members only: torch's Store interface over gRPC.

torch's TCPStore answers anyone who connects: any process that reaches its port can list, read,
write and delete every key (a rendezvous round, the address of a replica group's manager and
its member id, where gloo's ranks meet). Every store a job runs is this one instead: a server
that answers only calls carrying the job's store credential (trainer.contract.credentials), and a
client that is a `torch.distributed.Store`, so torchrun's rendezvous, torchft's manager and
gloo's rendezvous use it as they would a TCPStore (same semantics, blocking `get` and `wait`
included).

Run as `python -m trainer.fault_tolerance.kv_store --host 127.0.0.1 --port 29400`: a restart-mode
job's rendezvous store, apart from every pod, so no pod's death takes the rendezvous down with it.
It listens on `--host` only (its pod's address), takes the job's secret from PEER_SECRET, and
serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import io
import json
import logging
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import dynamic_rendezvous
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from trainer.contract import credentials
from trainer.fault_tolerance.store_wire import (
    AUTHORIZATION,
    SERVICE,
    Message,
    decode,
    encode,
    from_text,
    to_text,
)
from trainer.listen import STORE_TIMEOUT, url_host

logger = logging.getLogger(__name__)

MAX_WAIT = 3600.0
"""Seconds a blocking call may wait for its keys, whatever the client asks."""
RENDEZVOUS_KEYS = "torch.rendezvous."
"""Where torchrun's c10d rendezvous keeps a run's state: this and the run id (its rounds' keys
add `.round/...`)."""
LONG_AGO = datetime(1970, 1, 1, tzinfo=UTC)


class RendezvousStateReader(pickle.Unpickler):
    """Reads a pickled rendezvous state and loads no other class: members write it."""

    ALLOWED = frozenset({(dynamic_rendezvous.__name__, "_RendezvousState"),
                         (dynamic_rendezvous.__name__, "_NodeDesc"),
                         ("datetime", "datetime"), ("datetime", "timezone"),
                         ("datetime", "timedelta")})

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a rendezvous state")
        return super().find_class(module, name)


def forget_node(value: bytes, pid: int, addr: str) -> bytes | None:
    """A run's rendezvous state (base64 of a pickled `_RendezvousState`, as the c10d backend
    stores it) in which the nodes of process `pid` at `addr` were last heard from long ago, or
    None where it holds none. The next node to sync drops them, as torch drops a node whose
    keep-alives stopped, without waiting out the keep-alive expiry."""
    if value == C10dRendezvousBackend._NULL_SENTINEL.encode():
        return None
    try:
        state = RendezvousStateReader(io.BytesIO(base64.b64decode(value, validate=True))).load()
    except (binascii.Error, pickle.UnpicklingError, EOFError, ValueError) as exc:
        logger.warning("a rendezvous state that cannot be read: %s", exc)
        return None
    if not isinstance(state, dynamic_rendezvous._RendezvousState):
        return None
    dead = [node for node in state.last_heartbeats if node.pid == pid and node.addr == addr]
    for node in dead:
        state.last_heartbeats[node] = LONG_AGO
    return base64.b64encode(pickle.dumps(state)) if dead else None


class Table:
    """The keys and values, and waiting for keys to appear; kept in `state_file` too, where
    given, and read back from it at start."""

    def __init__(self, state_file: Path | None = None) -> None:
        self.values: dict[str, bytes] = {}
        self._changed = threading.Condition()
        self.state_file = state_file
        if state_file is not None:
            self._load(state_file)

    def _load(self, state_file: Path) -> None:
        try:
            saved = json.loads(state_file.read_text())
            self.values = {str(k): from_text(v) for k, v in saved.items()}
        except FileNotFoundError:
            return
        except (OSError, ValueError, AttributeError, binascii.Error) as exc:
            logger.warning("cannot read %s (%s): starting empty", state_file, exc)
            return
        logger.info("read %d keys back from %s", len(self.values), state_file)

    def _save(self) -> None:
        """Write every key to the state file (whole, replaced at once); called under the lock.
        A store restarted on its port then serves what its members wrote before, rendezvous
        state included: lost, every agent would wait out its read timeout and fail."""
        if self.state_file is None:
            return
        partial = self.state_file.with_name(f"{self.state_file.name}.partial")
        partial.write_text(json.dumps({k: to_text(v) for k, v in self.values.items()}))
        partial.replace(self.state_file)

    def _wait(self, keys: list[str], timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: all(k in self.values for k in keys),
                                          min(max(timeout, 0.0), MAX_WAIT))

    def _store(self, key: str, value: bytes) -> None:
        with self._changed:
            self.values[key] = value
            self._save()
            self._changed.notify_all()

    def set(self, m: Message) -> Message:
        self._store(m["key"], from_text(m["value"]))
        return {}

    def get(self, m: Message) -> Message:
        if not self._wait([m["key"]], m["timeout"]):
            return {"timeout": True}
        return {"value": to_text(self.values[m["key"]])}

    def add(self, m: Message) -> Message:
        with self._changed:
            total = int(self.values.get(m["key"], b"0")) + int(m["amount"])
            self._store(m["key"], str(total).encode())
        return {"count": total}

    def compare_set(self, m: Message) -> Message:
        """TCPStore's rule: a missing key counts as the empty value; returns what is stored
        after the call (`expected` when the key is missing and `expected` is not empty)."""
        key, expected, desired = m["key"], from_text(m["expected"]), from_text(m["desired"])
        with self._changed:
            current = self.values.get(key)
            if current == expected or (current is None and not expected):
                self._store(key, desired)
                return {"value": m["desired"]}
        return {"value": to_text(expected if current is None else current)}

    def wait(self, m: Message) -> Message:
        return {} if self._wait(list(m["keys"]), m["timeout"]) else {"timeout": True}

    def check(self, m: Message) -> Message:
        with self._changed:
            return {"ok": all(k in self.values for k in m["keys"])}

    def delete_key(self, m: Message) -> Message:
        with self._changed:
            deleted = self.values.pop(m["key"], None) is not None
            if deleted:
                self._save()
            return {"ok": deleted}

    def num_keys(self, m: Message) -> Message:
        with self._changed:
            return {"count": len(self.values)}

    def forget_node(self, m: Message) -> Message:
        """torchrun's rendezvous of run `run_id`: process `pid` at `addr` has ended (its pod's
        supervisor saw it), so its nodes are dead now (`forget_node`); a compare-and-set of a
        member that read the state before fails, and it reads this one."""
        key, pid, addr = RENDEZVOUS_KEYS + str(m["run_id"]), int(m["pid"]), str(m["addr"])
        with self._changed:
            value = self.values.get(key)
            state = None if value is None else forget_node(value, pid, addr)
            if state is not None:
                self._store(key, state)
        if state is not None:
            logger.info("rendezvous %s: process %d at %s has ended; its node drops at the "
                        "next sync", m["run_id"], pid, addr)
        return {"count": int(state is not None)}


METHODS = ("set", "get", "add", "compare_set", "wait", "check", "delete_key", "num_keys",
           "forget_node")


class DaemonThreads(futures.Executor):
    """Runs each call in a daemon thread of its own.

    A ThreadPoolExecutor's threads are joined when the interpreter exits, so a peer's blocking
    `get` in progress would hold a finished trainer up to its timeout.
    """

    def submit(self, fn: Callable[..., Any], /, *args: Any,
               **kwargs: Any) -> futures.Future[Any]:
        future: futures.Future[Any] = futures.Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:
                    future.set_exception(exc)

        threading.Thread(target=run, name="store-call", daemon=True).start()
        return future


class StoreServer:
    """A store served on `host:port` (0: a free port) to holders of `credential`, from
    threads of this process."""

    def __init__(self, host: str, port: int, credential: str, calls: int = 256,
                 state_file: Path | None = None) -> None:
        self.table = Table(state_file)
        self._expected = f"Bearer {credential}"
        self._server = grpc.server(DaemonThreads(),  # type: ignore[arg-type]  # any Executor
                                   maximum_concurrent_rpcs=calls)
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
            name: grpc.unary_unary_rpc_method_handler(
                self._guarded(getattr(self.table, name)), request_deserializer=decode,
                response_serializer=encode)
            for name in METHODS})])
        self.port = self._server.add_insecure_port(f"{url_host(host)}:{port}")
        if self.port == 0:
            raise OSError(f"the store cannot listen on {url_host(host)}:{port}")
        self._server.start()

    def _guarded(self, method: Callable[[Message], Message]) -> Callable[..., Message]:
        def handle(request: Message, context: grpc.ServicerContext) -> Message:
            metadata = dict(context.invocation_metadata())
            if metadata.get(AUTHORIZATION) != self._expected:
                logger.warning("refused a store call from %s: no or a wrong credential",
                               context.peer())
                context.abort(grpc.StatusCode.PERMISSION_DENIED, "not a member of this job")
            try:
                return method(request)
            except (KeyError, TypeError, ValueError) as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad request: {exc}")
                raise  # not reached: abort raises
        return handle

    def stop(self, grace: float | None = None) -> None:
        self._server.stop(grace).wait()


class MemberStore(dist.Store):
    """A client of a StoreServer at `target` (`host:port`), usable wherever torch takes a
    Store. Like a TCPStore client, a call waits for the server to come up, and `get`/`wait`
    for their keys, up to the store's timeout."""

    def __init__(self, target: str, credential: str,
                 timeout: timedelta = STORE_TIMEOUT) -> None:
        super().__init__()
        self.set_timeout(timeout)
        self.target, self._credential = target, credential
        self._channel = grpc.insecure_channel(target)
        self._metadata = ((AUTHORIZATION, f"Bearer {credential}"),)
        self._calls = {name: self._channel.unary_unary(
            f"/{SERVICE}/{name}", request_serializer=encode, response_deserializer=decode)
            for name in METHODS}

    @property
    def waits(self) -> timedelta:
        """How long a call waits for the server and for keys (torch's Store timeout, which
        callers may change with set_timeout)."""
        timeout: timedelta = self.timeout  # type: ignore[attr-defined]
        return timeout

    def _call(self, method: str, wait: float = 0.0, **request: Any) -> Message:
        deadline = self.waits.total_seconds() + wait
        started = time.monotonic()
        try:
            reply: Message = self._calls[method](request, timeout=deadline,
                                                  metadata=self._metadata, wait_for_ready=True)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise dist.DistStoreError(
                    f"store {self.target}: no answer to {method} within "
                    f"{time.monotonic() - started:.1f} s") from None
            if code == grpc.StatusCode.UNAVAILABLE:
                raise dist.DistNetworkError(f"store {self.target}: {details}") from None
            raise dist.DistStoreError(f"store {self.target}: {method}: {details}") from None
        if reply.get("timeout"):
            raise dist.DistStoreError(f"store {self.target}: timeout waiting for keys "
                                      f"({method})")
        return reply

    def _wait_seconds(self, timeout: timedelta | None = None) -> float:
        return (timeout or self.waits).total_seconds()

    def set(self, key: str, value: str | bytes) -> None:
        self._call("set", key=key, value=to_text(_as_bytes(value)))

    def get(self, key: str) -> bytes:
        seconds = self._wait_seconds()
        return from_text(self._call("get", wait=seconds, key=key, timeout=seconds)["value"])

    def add(self, key: str, amount: int) -> int:
        return int(self._call("add", key=key, amount=amount)["count"])

    def compare_set(self, key: str, expected: str | bytes,
                    desired: str | bytes) -> bytes:
        reply = self._call("compare_set", key=key, expected=to_text(_as_bytes(expected)),
                           desired=to_text(_as_bytes(desired)))
        return from_text(reply["value"])

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        seconds = self._wait_seconds(timeout)
        self._call("wait", wait=seconds, keys=list(keys), timeout=seconds)

    def check(self, keys: list[str]) -> bool:
        return bool(self._call("check", keys=list(keys))["ok"])

    def delete_key(self, key: str) -> bool:
        return bool(self._call("delete_key", key=key)["ok"])

    def num_keys(self) -> int:
        return int(self._call("num_keys")["count"])

    def clone(self) -> MemberStore:
        return MemberStore(self.target, self._credential, self.waits)


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.fault_tolerance.kv_store",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True, help="address to listen on (the pod's)")
    parser.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    parser.add_argument("--state-file", type=Path,
                        help="keep the keys in this file, and serve what it holds at start")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s store: %(message)s")
    try:
        secret = credentials.require(os.environ.get(credentials.SECRET_ENV, ""),
                                     "the rendezvous store")
    except credentials.MissingSecret as exc:
        logger.error("%s", exc)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = StoreServer(args.host, args.port, credentials.store_credential(secret),
                         state_file=args.state_file)
    logger.info("rendezvous store listening on %s:%d", url_host(args.host), server.port)
    stop.wait()
    logger.info("stopping")
    server.stop(grace=1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
