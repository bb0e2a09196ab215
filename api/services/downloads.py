"""Signed download links: the admin token stays out of URLs."""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request

from api.auth import LinkSigner
from api.models import DownloadLink


def link_signer(admin_token: str) -> LinkSigner:
    # Derived from the admin token: changing the token also revokes every link handed out.
    return LinkSigner(hmac.new(admin_token.encode(), b"download-links", hashlib.sha256).digest())


def signed_link(request: Request, path: str) -> DownloadLink:
    signer: LinkSigner = request.app.state.link_signer
    url, expires = signer.sign(path)
    return DownloadLink(url=url, expires_at=expires)
