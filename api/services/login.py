"""Single-use login codes: the dashboard's login URL carries one instead of the admin token."""

from __future__ import annotations

import hashlib
import math
import secrets
import threading
import time
from collections.abc import Callable

LOGIN_CODE_SECONDS = 600
"""How long a login code works (it works once)."""
MAX_CODES = 100
"""Codes kept at most; past it, the oldest is dropped (each needs an admin to make it)."""


def _digest(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


class LoginCodes:
    """Codes that each buy the admin token once, before they expire.

    Kept in this process's memory (the API runs as one; a restart revokes every code), by their
    hash: a lookup's timing says nothing about a valid code's text.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._expiries: dict[str, float] = {}
        self._lock = threading.Lock()

    def issue(self, seconds: float = LOGIN_CODE_SECONDS) -> tuple[str, int]:
        """A new code and its expiry (Unix time)."""
        code = secrets.token_urlsafe(24)
        now = self._clock()
        with self._lock:
            for digest, expires in list(self._expiries.items()):
                if expires < now:
                    del self._expiries[digest]
            while len(self._expiries) >= MAX_CODES:
                del self._expiries[next(iter(self._expiries))]
            self._expiries[_digest(code)] = now + seconds
        return code, math.ceil(now + seconds)

    def redeem(self, code: str) -> bool:
        """Whether the code is valid now; either way, it is not any more."""
        with self._lock:
            expires = self._expiries.pop(_digest(code), None)
        return expires is not None and self._clock() <= expires
