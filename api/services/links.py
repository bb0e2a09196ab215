"""Signed links, for what cannot send the admin token as a header (a browser's download, an
EventSource): the token stays out of URLs."""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request

from api.auth import LINK_SECONDS, LinkSigner
from api.models import DownloadLink, StreamLink
from api.settings import Settings


def link_signer(admin_token: str) -> LinkSigner:
    # Derived from the admin token: changing the token also revokes every link handed out.
    return LinkSigner(hmac.new(admin_token.encode(), b"signed-links", hashlib.sha256).digest())


def signed_link(request: Request, path: str) -> DownloadLink:
    signer: LinkSigner = request.app.state.link_signer
    url, expires = signer.sign(path, LINK_SECONDS)
    return DownloadLink(url=url, expires_at=expires)


def stream_link(request: Request, settings: Settings, job_id: str) -> StreamLink:
    """A link to open the job's event stream once, soon: a reconnect asks for a new one, so a
    link that leaks (a proxy's log) is soon worth nothing. An open stream is never cut."""
    signer: LinkSigner = request.app.state.link_signer
    path = request.app.url_path_for("stream", job_id=job_id)
    url, expires = signer.sign(path, settings.stream_link_seconds)
    return StreamLink(url=url, expires_at=expires)
