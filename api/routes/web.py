"""The browser dashboard: web/index.html, its modules under /static/, uPlot under /vendor/uplot/.

None of it needs a token (the files hold no data); the page reads everything from the
token-protected API. Files are served by StaticFiles, which resolves paths inside its directory
only, or as one fixed file; nothing joins a request path by hand.
"""

from __future__ import annotations

import os
from os import PathLike
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import Scope

from api.errors import NotFound

WEB_DIR = Path(__file__).resolve().parents[2] / "web"
UPLOT_DIST = Path("node_modules") / "uplot" / "dist"

# The page runs only its own scripts; inline styles are allowed for uPlot's legend and cursor.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
                               "object-src 'none'; base-uri 'none'; form-action 'self'; "
                               "frame-ancestors 'none'",
    # Nothing of the page's address goes on to another site.
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


class RevalidatedFiles(StaticFiles):
    """Static files the browser revalidates (ETag) before each use: after an upgrade, the page
    never runs a mix of old and new modules from its heuristic cache."""

    def file_response(self, full_path: PathLike[str] | str, stat_result: os.stat_result,
                      scope: Scope, status_code: int = 200) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers["Cache-Control"] = "no-cache"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def mount_web(app: FastAPI, web_dir: Path = WEB_DIR) -> None:
    """Serve the dashboard at `/`; a missing uPlot (no `make setup`) is a 404 saying so."""
    index = web_dir / "index.html"

    @app.get("/", include_in_schema=False, response_class=FileResponse)
    def dashboard() -> FileResponse:
        if not index.is_file():
            raise NotFound(f"the dashboard is not installed ({index} is missing)")
        return FileResponse(index, media_type="text/html", headers=PAGE_HEADERS)

    if (web_dir / "static").is_dir():  # an image built without web/ serves the API only
        app.mount("/static", RevalidatedFiles(directory=web_dir / "static"), name="static")
    uplot = web_dir / UPLOT_DIST
    if uplot.is_dir():
        app.mount("/vendor/uplot", RevalidatedFiles(directory=uplot), name="uplot")
    else:
        @app.get("/vendor/uplot/{name}", include_in_schema=False)
        def uplot_missing(name: str) -> None:
            raise NotFound(f"uPlot is not installed: run `make setup` (npm ci in {web_dir})")
