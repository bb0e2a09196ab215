"""The job store's wire format (trainer.fault_tolerance.kv_store), without torch: JSON messages
over gRPC, each call carrying the job's store credential. The store's own client is a torch
Store; `call` is one request for those that need no torch, as the local supervisor does."""

from __future__ import annotations

import base64
import json
from typing import Any

import grpc

SERVICE = "livemigrator.Store"
AUTHORIZATION = "authorization"
Message = dict[str, Any]


def encode(message: Message) -> bytes:
    return json.dumps(message).encode()


def decode(data: bytes) -> Message:
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError("a store message is a JSON object")
    return message


def to_text(value: bytes) -> str:
    """A value as messages carry it (base64)."""
    return base64.b64encode(value).decode()


def from_text(value: str) -> bytes:
    return base64.b64decode(value)


def call(target: str, credential: str, method: str, timeout: float, **request: Any) -> Message:
    """One call of `method` on the store at `target` (`host:port`); raises grpc.RpcError."""
    with grpc.insecure_channel(target) as channel:
        stub = channel.unary_unary(f"/{SERVICE}/{method}", request_serializer=encode,
                                   response_deserializer=decode)
        reply: Message = stub(request, timeout=timeout,
                              metadata=((AUTHORIZATION, f"Bearer {credential}"),))
        return reply
