"""The control plane's API as the CLI and the demo use it: bearer token, readable errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from api.settings import Settings


class CliError(Exception):
    """A failure to report in one line; `exit_code` is what the command exits with."""

    exit_code = 1


class BadInput(CliError):
    """The user's input (arguments, spec, settings) is unusable: nothing was sent."""

    exit_code = 2


class ApiError(CliError):
    """The API answered with an error status; the message is its `{"error", "detail"}` body."""

    def __init__(self, status: int, error: str, detail: Any) -> None:
        super().__init__(f"{status} {error}: {describe_detail(detail)}")
        self.status, self.error, self.detail = status, error, detail


def describe_detail(detail: Any) -> str:
    """One line for an error's detail; a 422's list becomes `field: message; ...`."""
    if isinstance(detail, list):
        problems = []
        for problem in detail:
            if not isinstance(problem, dict):
                problems.append(str(problem))
                continue
            loc = [str(part) for part in problem.get("loc", [])]
            if loc and loc[0] in ("body", "query", "path"):
                loc = loc[1:]  # where the field was sent, not which: `resources.cpu` says it
            message = str(problem.get("msg", problem))
            problems.append(f"{'.'.join(loc)}: {message}" if loc else message)
        return "; ".join(problems)
    if isinstance(detail, str):
        return " ".join(detail.split())
    return json.dumps(detail)


def api_error(response: httpx.Response) -> ApiError:
    """The error a response carries; bodies other than the API's own (a proxy's) are cut short."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "detail" in body:
        return ApiError(response.status_code, str(body.get("error", "error")), body["detail"])
    text = " ".join(response.text.split())
    return ApiError(response.status_code, response.reason_phrase or "error",
                    text[:200] or "(no body)")


def describe_settings_error(exc: ValidationError) -> str:
    """Settings' validation error as one line naming the variables."""
    problems = [f"MIGRATOR_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
                for e in exc.errors()]
    return "invalid settings: " + "; ".join(problems)


def load_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        raise BadInput(describe_settings_error(exc)) from None


def configured_token(settings: Settings) -> str | None:
    """MIGRATOR_ADMIN_TOKEN, else the token the server generated in its data dir, if any."""
    if settings.admin_token:
        return settings.admin_token
    path = settings.admin_token_file
    return path.read_text().strip() if path.is_file() else None


def resolve_token(explicit: str | None) -> str:
    """--token, else the configured token."""
    token = explicit or configured_token(load_settings())
    if token is None:
        raise BadInput("no token: pass --token, set MIGRATOR_ADMIN_TOKEN, or run where the "
                       "server's data dir is")
    return token


class Client:
    """The API at `url` with a bearer token.

    `http` replaces the connection (tests pass the app's TestClient, whose base URL wins).
    """

    def __init__(self, url: str, token: str, http: httpx.Client | None = None) -> None:
        self.http = http or httpx.Client(base_url=url.rstrip("/"), timeout=30)
        # Per request, not on the client: an injected client is not ours to change.
        self.headers = {"Authorization": f"Bearer {token}"}

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            headers = {**self.headers, **kwargs.pop("headers", {})}
            response = self.http.request(method, path, headers=headers, **kwargs)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach {self.http.base_url}: {one_line(exc)}") from None
        if response.is_error:
            raise api_error(response)
        return response

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The answer's JSON body (None for an empty one, as a 204 has)."""
        response = self.send(method, path, **kwargs)
        return response.json() if response.content else None

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job: its pods stop, its record and checkpoints stay."""
        try:
            answer: dict[str, Any] = self.request("POST", f"/api/v1/jobs/{job_id}/cancel")
        except ApiError as exc:
            # Servers before the cancel route cancelled with DELETE and answer 404/405 here. On
            # a newer server a 404 means the job is missing, and DELETE then says so as well.
            if exc.status not in (404, 405):
                raise
            answer = self.request("DELETE", f"/api/v1/jobs/{job_id}")
        return answer

    def download(self, path: str, target: Path) -> None:
        """Stream a GET's body into `target`; a failure midway leaves no partial file."""
        started = False
        try:
            with self.http.stream("GET", path, headers=self.headers) as response:
                if response.is_error:
                    response.read()
                    raise api_error(response)
                with target.open("wb") as handle:
                    started = True
                    for chunk in response.iter_bytes():
                        handle.write(chunk)
        except httpx.HTTPError as exc:
            if started:
                target.unlink(missing_ok=True)
            raise CliError(f"cannot reach {self.http.base_url}: {one_line(exc)}") from None


def one_line(exc: Exception) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
