"""`python -m api`: start the control plane and print how to log in."""

from __future__ import annotations

import argparse
import os
import sys

import uvicorn
from pydantic import ValidationError

from api.app import AdminToken, create_app
from api.db import init_db, make_engine
from api.logs import configure_logging
from api.migrations import SchemaError
from api.services.login import LOGIN_CODE_SECONDS, LoginCodes
from api.settings import Settings
from trainer.contract.process import PRIVATE_UMASK
from trainer.contract.runtime import host_port


def login_hint(url: str, token: AdminToken, codes: LoginCodes, terminal: bool) -> str:
    """How to log in. A person at the terminal gets a login URL with a single-use code (no URL
    carries the token itself), and the token only when this start generated it; a log
    (`kubectl logs`, a log collector) gets neither, only where to find them."""
    if token.source == "settings":
        where = "Admin token: the one set in MIGRATOR_ADMIN_TOKEN"
    elif token.source == "generated" and terminal:
        where = f"API token for curl: -H 'Authorization: Bearer {token.value}'"
    else:
        where = f"Admin token: in {token.path} (readable by this user only)"
    if not terminal:
        return f"{where}; a dashboard login URL: `migrator login-url`"
    code, _ = codes.issue(LOGIN_CODE_SECONDS)
    return (f"Log in: {url}/#login={code} (once, within {LOGIN_CODE_SECONDS // 60} minutes; "
            f"`migrator login-url` prints a new one)\n{where}")


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Settings from the environment; --host and --port override them only when given."""
    parser = argparse.ArgumentParser(prog="python -m api", description=__doc__)
    parser.add_argument("--host", help="default: MIGRATOR_HOST, else 127.0.0.1")
    parser.add_argument("--port", type=int, help="default: MIGRATOR_PORT, else 8000")
    args = parser.parse_args(argv)
    return Settings(**{name: value for name, value in vars(args).items() if value is not None})


def main(argv: list[str] | None = None) -> int:
    try:
        settings = parse_settings(argv)
    except ValidationError as exc:
        print(f"invalid settings: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format)
    os.umask(PRIVATE_UMASK)  # the database, the token, the job directories: this user's alone
    engine = make_engine(settings)
    try:
        init_db(engine)
    except SchemaError as exc:
        print(f"cannot use the database: {exc}", file=sys.stderr)
        return 2
    finally:
        engine.dispose()
    app = create_app(settings)
    url = f"http://{host_port(settings.host, settings.port)}"
    print(f"Live Migrator control plane on {url} ({settings.backend} backend, data in "
          f"{settings.data_dir.resolve()})", flush=True)
    print(login_hint(url, app.state.admin_token, app.state.login_codes, sys.stdout.isatty()),
          flush=True)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
