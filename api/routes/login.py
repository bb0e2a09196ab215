"""Logging in to the dashboard with a single-use code, so that no URL carries the admin token."""

from __future__ import annotations

from fastapi import APIRouter

from api.auth import AdminRoute
from api.deps import AdminTokenDep, LoginCodesDep
from api.errors import Forbidden, error_responses
from api.models import LoginLink, LoginRequest, LoginToken
from api.routes import API_PREFIX
from api.services.login import LOGIN_CODE_SECONDS

router = APIRouter(prefix=API_PREFIX, tags=["login"], route_class=AdminRoute,
                   responses=error_responses(401, 403, 422))
# The exchange itself takes no token: the code is the credential.
exchange = APIRouter(prefix=API_PREFIX, tags=["login"], responses=error_responses(403, 413, 422))


@router.post("/login-codes", response_model=LoginLink)
def create_login_code(codes: LoginCodesDep) -> LoginLink:
    """A dashboard login URL (the path; `migrator login-url` prints it whole) that works once,
    within 10 minutes."""
    code, expires = codes.issue(LOGIN_CODE_SECONDS)
    return LoginLink(url=f"/#login={code}", expires_at=expires)


@exchange.post("/login", response_model=LoginToken)
def login(body: LoginRequest, codes: LoginCodesDep, admin_token: AdminTokenDep) -> LoginToken:
    """The admin token for a login code, once: the dashboard keeps it in the tab's session
    storage and sends it as a bearer header."""
    if not codes.redeem(body.code):
        raise Forbidden(f"this login code is unknown, used or expired: each works once, for "
                        f"{LOGIN_CODE_SECONDS // 60} minutes (`migrator login-url` prints a new "
                        "login URL)")
    return LoginToken(token=admin_token)
