"""A live job's lighthouse: torchft's quorum service, and a replica that can say it leaves.

torchft's lighthouse (Rust) learns that a replica is gone only when the replica's heartbeats
stop for `heartbeat_timeout`: a replica that leaves on purpose (scale-down, the old half of a
migration, SIGTERM) would cost its peers that wait, as a crash does. This server speaks the same
gRPC service to torchft's managers (`torchft.LighthouseService`: Quorum and Heartbeat) and forms
quorums by the same rules, plus one call of its own, `Leave`: a replica that committed its last
step says so, and the next quorum goes on without it at once. Both protocols are `.proto` files
beside this module (torchft.proto is torchft's own), compiled by grpcio-tools when it loads.

Only the job's own pods are heard: a Quorum, Heartbeat or Leave is answered only under a member
id whose tag proves the job's peer secret (trainer.contract.credentials), so a stranger that can
reach the port can neither join the quorum (and serve its state to healing pods) nor evict a
replica, and it learns nothing about the job's members.

The quorum rules (those of torchft's lighthouse): a quorum forms at once when every member of
the previous one asked for the next ("fast quorum"); otherwise when more than half of the
heartbeating replicas asked and either all of them did or the join timeout passed since the
first asked. A replica that left counts as neither a previous member nor a heartbeating one.

Two rules of our own keep a recreated pod from waiting a whole step for its peers' next quorum.
A replica heard from for the first time moments ago is waited for, up to the join timeout, by a
quorum of the previous members. And a replica that died and is replaced at once (its supervisor
hands its place to a warm standby, and says so as it reports it gone: `Leave` with `replaced`)
is waited for before the replacement is even heard from, up to the join timeout: the survivors'
next quorum then takes the replacement in, instead of leaving it to wait out their next step.

A third tells a job's start from a rejoin. A pod is heard from only once it has
loaded its model and data (trainer.main), so a pod still loading costs its peers' quorums no
wait. At the job's start, no quorum has formed yet and every replica that asks is at step 0:
the first quorum waits for the job's `replicas`, up to the start timeout, or the first pod
loaded would train alone and the others heal from it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool
from google.protobuf.message_factory import GetMessageClass
from grpc_tools import protoc

from trainer.contract import credentials
from trainer.contract.runtime import host_port

logger = logging.getLogger(__name__)

PROTOCOL = Path(__file__).with_name("lighthouse.proto")
"""Our Leave service; it imports torchft's protocol (torchft.proto beside it)."""
REFUSALS_LOGGED_EVERY = 10.0
"""Seconds between two log lines about refused strangers (their clients retry many times a
second)."""


def compile_protocol(proto: Path) -> descriptor_pool.DescriptorPool:
    """`proto` and what it imports, compiled by grpcio-tools' protoc when the module loads: a
    pool of their own, so nothing generated is checked in or installed."""
    well_known = resources.files("grpc_tools") / "_proto"  # google/protobuf/timestamp.proto
    with tempfile.TemporaryDirectory() as scratch:
        compiled = Path(scratch) / "descriptors.pb"
        status = protoc.main(["protoc", f"--proto_path={proto.parent}",
                              f"--proto_path={well_known}", "--include_imports",
                              f"--descriptor_set_out={compiled}", proto.name])
        if status != 0:
            raise RuntimeError(f"protoc could not compile {proto} (exit {status})")
        files = descriptor_pb2.FileDescriptorSet.FromString(compiled.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:  # dependencies first
        pool.Add(file)
    return pool


POOL = compile_protocol(PROTOCOL)
TORCHFT_SERVICE = POOL.FindServiceByName("torchft.LighthouseService")
LEAVE_SERVICE = POOL.FindServiceByName("livemigrator.Lighthouse")
LEAVE = LEAVE_SERVICE.methods_by_name["Leave"]


def message(described: descriptor.Descriptor) -> type[Any]:
    """The class of a message of the pool (Any: its fields are known only when it loads)."""
    return GetMessageClass(described)


QuorumMember = message(POOL.FindMessageTypeByName("torchft.QuorumMember"))
Quorum = message(POOL.FindMessageTypeByName("torchft.Quorum"))
QuorumResponse = message(TORCHFT_SERVICE.methods_by_name["Quorum"].output_type)
HeartbeatResponse = message(TORCHFT_SERVICE.methods_by_name["Heartbeat"].output_type)
LeaveRequest, LeaveResponse = message(LEAVE.input_type), message(LEAVE.output_type)


@dataclass
class Options:
    min_replicas: int = 1
    join_timeout: float = 1.0
    """Seconds to wait for heartbeating replicas that have not asked for the next quorum."""
    heartbeat_timeout: float = 0.5
    """Seconds without a heartbeat after which a replica counts as dead."""
    tick: float = 0.1
    replicas: int = 1
    """The replicas the job starts with: its first quorum waits for all of them."""
    start_timeout: float = 60.0
    """Seconds from the first ask that the job's first quorum waits for its `replicas`."""


@dataclass
class Joined:
    at: float
    member: Any


@dataclass
class Membership:
    """What the quorum is decided from; `decide` is pure so the rules can be tested alone."""

    options: Options
    heartbeats: dict[str, float] = field(default_factory=dict)
    arrived: dict[str, float] = field(default_factory=dict)
    """When each replica was first heard from (a recreated pod is a new replica id); set with
    its first heartbeat (`beat`), so every replica in `heartbeats` has one."""
    joined: dict[str, Joined] = field(default_factory=dict)
    """Replicas that asked for the next quorum, and when."""
    previous: list[str] | None = None
    """The members of the last quorum, by replica id."""
    left: set[str] = field(default_factory=set)
    replacements: list[float] = field(default_factory=list)
    """When each replacement still to be heard from was announced (`Leave` with `replaced`)."""

    def beat(self, replica: str, now: float) -> None:
        """A heartbeat, or a request (which is one too)."""
        self.heartbeats[replica] = now
        if replica not in self.arrived:
            self.arrived[replica] = now
            self.replacements = self.replacements[1:]  # one of those announced, or a newcomer

    def gone(self, replica: str, now: float, replaced: bool) -> None:
        """`replica` left or died; `replaced`: a replacement has started."""
        self.left.add(replica)
        for record in (self.heartbeats, self.arrived, self.joined):
            record.pop(replica, None)
        if replaced:
            self.replacements = [t for t in self.replacements
                                 if now - t < self.options.join_timeout] + [now]

    def decide(self, now: float) -> tuple[list[Any] | None, str]:
        """The next quorum's members (sorted by replica id), or None; and why."""
        healthy = {r for r, beat in self.heartbeats.items()
                   if now - beat < self.options.heartbeat_timeout and r not in self.left}
        asking = {r: j for r, j in self.joined.items() if r in healthy}
        members = [asking[r].member for r in sorted(asking)]
        state = f"[{len(asking)}/{len(self.joined)} asking healthy][{len(healthy)} heartbeating]"
        if self.previous is not None:
            shrink_only = any(j.member.shrink_only for j in asking.values())
            if shrink_only:
                members = [m for m in members if m.replica_id in self.previous]
            staying = [r for r in self.previous if r not in self.left]
            if staying and all(r in asking for r in staying):
                # A replica heard from for the first time moments ago (a recreated or added
                # pod, loaded, between its first heartbeat and its first ask) is waited for up
                # to the join timeout: formed without it, the quorum would leave it a step to
                # wait.
                if not shrink_only and any(
                        now - self.arrived[r] < self.options.join_timeout
                        for r in healthy - set(self.previous) - set(asking)):
                    return None, f"waiting for a newcomer up to the join timeout {state}"
                if not shrink_only and any(now - announced < self.options.join_timeout
                                           for announced in self.replacements):
                    return None, (f"waiting for a dead replica's replacement up to the join "
                                  f"timeout {state}")
                return members, f"fast quorum {state}"
        if self.previous is None and 0 < len(asking) < self.options.replicas and all(
                j.member.step == 0 for j in asking.values()):
            # The job's start (a lighthouse restarted mid-job hears replicas past step 0).
            first = min(j.at for j in asking.values())
            if now - first < self.options.start_timeout:
                return None, (f"waiting for the job's {self.options.replicas} replicas to "
                              f"start, up to the start timeout {state}")
        if len(asking) < self.options.min_replicas:
            return None, f"waiting for min_replicas {self.options.min_replicas} {state}"
        if len(asking) <= len(healthy) / 2:
            return None, f"waiting for more than half of the heartbeating replicas {state}"
        # The stragglers' wait runs from the ask that made the quorum possible, not the first
        # one: a replica left out of the last quorum asks a whole step early, and counting from
        # its ask would close each quorum on the first peer to finish, so one replica would be
        # left out of every quorum (each pair in turn, healing every third step).
        asked = sorted(j.at for j in asking.values())
        possible = asked[max(self.options.min_replicas, len(healthy) // 2 + 1) - 1]
        if len(asking) < len(healthy) and now - possible < self.options.join_timeout:
            return None, f"waiting for stragglers up to the join timeout {state}"
        return members, f"quorum {state}"


class Lighthouse:
    """The quorum state of one job, served to its replicas' managers.

    Every handler runs on one event loop and changes the state without awaiting in between,
    so each change and the decision it triggers is atomic: no lock is needed."""

    def __init__(self, options: Options, secret: str) -> None:
        self.secret = credentials.require(secret, "the lighthouse")
        self.membership = Membership(options)
        self._refused, self._refusal_logged = 0, -REFUSALS_LOGGED_EVERY
        self.quorum_id = 0
        self._waiting: set[asyncio.Queue[Any]] = set()
        self._reason = ""

    async def _member(self, replica: str, context: grpc.aio.ServicerContext) -> None:
        """Refuse a request whose replica id is not one of this job's pods'."""
        if credentials.member_pod(self.secret, replica) is None:
            self._refused += 1
            now = time.monotonic()
            if now - self._refusal_logged >= REFUSALS_LOGGED_EVERY:  # a stranger retries
                logger.warning("refused %d requests from strangers (the last from %s): not "
                               "members of this job", self._refused, context.peer())
                self._refused, self._refusal_logged = 0, now
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                "not a member of this job")

    async def quorum(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        requester = request.requester
        replica = requester.replica_id
        await self._member(replica, context)
        if replica in self.membership.left:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"replica {replica} has left this job")
        inbox: asyncio.Queue[Any] = asyncio.Queue()
        now = time.monotonic()
        self.membership.beat(replica, now)
        self.membership.joined[replica] = Joined(now, requester)
        self._waiting.add(inbox)
        self._tick()
        try:
            while True:
                quorum = await inbox.get()
                if any(m.replica_id == replica for m in quorum.participants):
                    return QuorumResponse(quorum=quorum)
                # Formed without it: it asks for the next one.
                self.membership.joined[replica] = Joined(time.monotonic(), requester)
        finally:
            self._waiting.discard(inbox)

    async def heartbeat(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._member(request.replica_id, context)
        if request.replica_id not in self.membership.left:
            self.membership.beat(request.replica_id, time.monotonic())
        return HeartbeatResponse()

    async def leave(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        replica = request.replica_id
        await self._member(replica, context)
        self.membership.gone(replica, time.monotonic(), request.replaced)
        logger.info("replica %s left%s", credentials.shown(replica),
                    "; its replacement has started" if request.replaced else "")
        self._tick()
        return LeaveResponse()

    async def run_ticks(self) -> None:
        """Decide on a timer too: heartbeats expire and join timeouts pass without requests."""
        while True:
            await asyncio.sleep(self.membership.options.tick)
            self._tick()

    def _tick(self) -> None:
        members, reason = self.membership.decide(time.monotonic())
        if reason != self._reason:
            logger.info("%s", reason)
            self._reason = reason
        if members is None:
            return
        ids = [m.replica_id for m in members]
        if ids != self.membership.previous or any(m.commit_failures > 0 for m in members):
            self.quorum_id += 1
        quorum = Quorum(quorum_id=self.quorum_id, participants=members)
        quorum.created.GetCurrentTime()
        logger.info("quorum %d: %s", self.quorum_id, ", ".join(map(credentials.shown, ids)))
        self.membership.previous = ids
        self.membership.joined.clear()
        for inbox in self._waiting:
            inbox.put_nowait(quorum)


def served(service: descriptor.ServiceDescriptor,
           methods: dict[str, Callable[..., Any]]) -> grpc.GenericRpcHandler:
    """`service`'s methods, answered by `methods` (by method name)."""
    def unary(name: str) -> grpc.RpcMethodHandler:
        method = service.methods_by_name[name]
        return grpc.unary_unary_rpc_method_handler(
            methods[name], request_deserializer=message(method.input_type).FromString,
            response_serializer=message(method.output_type).SerializeToString)

    return grpc.method_handlers_generic_handler(service.full_name,
                                                {name: unary(name) for name in methods})


def handlers(lighthouse: Lighthouse) -> Iterable[grpc.GenericRpcHandler]:
    return [served(TORCHFT_SERVICE, {"Quorum": lighthouse.quorum,
                                     "Heartbeat": lighthouse.heartbeat}),
            served(LEAVE_SERVICE, {"Leave": lighthouse.leave})]


async def serve(bind: str, options: Options, secret: str) -> None:
    lighthouse = Lighthouse(options, secret)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(list(handlers(lighthouse)))
    port = server.add_insecure_port(bind)
    await server.start()
    logger.info("lighthouse listening on %s (port %d)", bind, port)
    ticks = asyncio.create_task(lighthouse.run_ticks())
    try:
        await server.wait_for_termination()
    finally:
        ticks.cancel()


def leave(lighthouse: str, replica_id: str, timeout: float = 5.0, replaced: bool = False,
          ) -> None:
    """Tell `lighthouse` (`http://host:port`) that `replica_id` has left; `replaced`: that a
    process taking its place has started."""
    target = lighthouse.removeprefix("http://")
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(f"/{LEAVE_SERVICE.full_name}/{LEAVE.name}",
                                   request_serializer=LeaveRequest.SerializeToString,
                                   response_deserializer=LeaveResponse.FromString)
        call(LeaveRequest(replica_id=replica_id, replaced=replaced), timeout=timeout)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True, help="address to listen on (the pod's)")
    parser.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    parser.add_argument("--min_replicas", type=int, default=1)
    parser.add_argument("--join_timeout_ms", type=int, default=1000)
    parser.add_argument("--heartbeat_timeout_ms", type=int, default=500)
    parser.add_argument("--quorum_tick_ms", type=int, default=100)
    parser.add_argument("--replicas", type=int, default=1,
                        help="replicas the job starts with: its first quorum waits for them")
    parser.add_argument("--start_timeout_ms", type=int, default=60_000,
                        help="how long the first quorum waits for the job's replicas")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    options = Options(min_replicas=args.min_replicas, join_timeout=args.join_timeout_ms / 1000,
                      heartbeat_timeout=args.heartbeat_timeout_ms / 1000,
                      tick=args.quorum_tick_ms / 1000, replicas=args.replicas,
                      start_timeout=args.start_timeout_ms / 1000)
    try:
        secret = credentials.require(os.environ.get(credentials.SECRET_ENV, ""), "the lighthouse")
    except credentials.MissingSecret as exc:
        sys.exit(f"lighthouse: {exc}")
    asyncio.run(serve(host_port(args.host, args.port), options, secret))


if __name__ == "__main__":
    main()
