"""What the supervisor's processes inherit, and where they listen."""

from __future__ import annotations

import os
import socket

from api.backends import programs
from trainer.contract.artifact_store import STORE_VARIABLES
from trainer.contract.staged import HUB_TOKEN_VARIABLES

SETTINGS_PREFIX = "MIGRATOR_"  # api.settings.Settings' env prefix


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((programs.LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def inherited_env(store_credentials: bool) -> dict[str, str]:
    """This supervisor's environment without the control plane's own settings (its admin
    token, database URL) and the hub token: a job's processes hold only their job's secrets;
    without the artifact store's credentials unless `store_credentials` (a job with its own
    gets that instead)."""
    withheld = (SETTINGS_PREFIX, *HUB_TOKEN_VARIABLES,
                *(() if store_credentials else STORE_VARIABLES))
    return {k: v for k, v in os.environ.items() if not k.startswith(withheld)}
