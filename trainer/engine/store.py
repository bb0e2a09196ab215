"""The rendezvous store of a restart-mode job: a standalone TCPStore process.

Run as `python -m trainer.engine.store --host 127.0.0.1 --port 29400`. Torchrun's agents meet
here (`--rdzv-conf is_host=false`); it lives apart from every pod, so no pod's death takes the
rendezvous down with it. It listens on `--host` only (its pod's address) and serves until SIGTERM
or SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from trainer.listen import bound_store, url_host

logger = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.engine.store",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True, help="address to listen on (the pod's)")
    parser.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s store: %(message)s")
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    store = bound_store(args.host, args.port)
    logger.info("rendezvous store listening on %s:%d", url_host(args.host), store.port)
    stop.wait()
    logger.info("stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
