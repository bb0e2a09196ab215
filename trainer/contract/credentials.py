"""What a job's processes prove to each other with the job's peer secret, which never travels.

The backend gives each job one random secret (PEER_SECRET), in the environment of its pods and
of its coordinator only: never in an argv, a manifest's literal or a file others can read.
Everything a process shows another is derived from it with HMAC-SHA256:
- a live pod's member id, `<pod>~<tag>`: torchft's managers send their replica id with every
  quorum request and heartbeat and have no other field a credential could travel in, so the
  lighthouse accepts a request only under an id whose tag is the pod's;
- the bearer credential of the job's stores (the rendezvous store, a pipeline replica's store);
- heal requests and replies: each side signs the request's fresh nonce and path, so a heal
  needs the secret on both ends and the secret itself never crosses the network.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SECRET_ENV = "PEER_SECRET"
"""The environment variable that holds the job's peer secret."""
MEMBER_SEPARATOR = "~"
"""Between a pod's name and its tag in a member id (pod names are DNS labels: no `~`)."""


class MissingSecret(ValueError):
    """A process that must prove or check membership was started without the job's secret."""


def require(secret: str, who: str) -> str:
    if not secret:
        raise MissingSecret(f"{who} needs its job's peer secret ({SECRET_ENV}): it accepts or "
                            f"serves only the job's own pods")
    return secret


def sign(secret: str, purpose: str, *parts: str) -> str:
    """A url-safe HMAC of `parts` for `purpose`, under the job's secret."""
    message = "\n".join((purpose, *parts)).encode()
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()[:18]
    return base64.urlsafe_b64encode(digest).decode()


def verify(signature: str | None, secret: str, purpose: str, *parts: str) -> bool:
    return signature is not None and hmac.compare_digest(
        signature.encode(), sign(secret, purpose, *parts).encode())


def member_id(secret: str, pod: str) -> str:
    """The id a live pod joins its job's lighthouse under (torchft appends `:<uuid>`)."""
    return f"{pod}{MEMBER_SEPARATOR}{sign(secret, 'member', pod)}"


def member_pod(secret: str, replica_id: str) -> str | None:
    """The pod a replica id belongs to, or None when its tag is not the job's."""
    member = replica_id.split(":", 1)[0]
    pod, separator, tag = member.rpartition(MEMBER_SEPARATOR)
    if not separator or not pod or not verify(tag, secret, "member", pod):
        return None
    return pod


def shown(replica_id: str) -> str:
    """A replica id as logs show it: the pod and torchft's uuid, never the tag."""
    member, _, uuid = replica_id.partition(":")
    pod = member.rpartition(MEMBER_SEPARATOR)[0] or member
    return f"{pod}:{uuid[:8]}" if uuid else pod


def store_credential(secret: str) -> str:
    """The bearer credential of the job's stores."""
    return sign(secret, "store")


def nonce() -> str:
    return secrets.token_urlsafe(18)
