"""Signed links, for what cannot send the admin token as a header (a browser's download, an
EventSource): the token stays out of URLs."""

from __future__ import annotations

import hashlib
import hmac

from api.auth import LINK_SECONDS, LinkSigner
from api.models import DownloadLink, StreamLink
from api.settings import Settings


def link_signer(admin_token: str) -> LinkSigner:
    # Derived from the admin token: changing the token also revokes every link handed out.
    return LinkSigner(hmac.new(admin_token.encode(), b"signed-links", hashlib.sha256).digest())


def signed_link(signer: LinkSigner, path: str) -> DownloadLink:
    url, expires = signer.sign(path, LINK_SECONDS)
    return DownloadLink(url=url, expires_at=expires)


def stream_link(signer: LinkSigner, path: str, settings: Settings) -> StreamLink:
    """A link to open the job's event stream (at `path`) once, soon: a reconnect asks for a new
    one, so a link that leaks (a proxy's log) is soon worth nothing. An open stream is never
    cut."""
    url, expires = signer.sign(path, settings.stream_link_seconds)
    return StreamLink(url=url, expires_at=expires)
