"""A Hugging Face hub that takes uploads, for the tests of pushing a model (trainer.hub_push).

No server that takes the hub's uploads installs here (olah, tests/hub/mirror.py, is a read-only
mirror; KohakuHub needs lakeFS), so this one implements the part of the hub's upload protocol
that `huggingface_hub` (pinned in pyproject.toml) speaks for `create_repo` and `create_commit`,
as the client sends it, with the hub's status codes:

- `POST /api/repos/create` (`name`, `organization`, `visibility` or `private`, `type`): the
  repository, 409 if it exists; 401 without the token.
- `POST /api/validate-yaml`: a README's metadata, taken as valid (a test reads the README).
- `POST /api/models/<org>/<name>/preupload/<revision>`: each file's upload mode: `lfs` for
  weights and files of 10 MB or more, `regular` (inlined in the commit) for the rest.
- `POST /<org>/<name>.git/info/lfs/objects/batch`: Git LFS's batch API, `basic` transfer: an
  upload action (a PUT of the whole file, its SHA-256 checked) and a verify action per object
  not stored yet; none for an object stored already.
- `POST /api/models/<org>/<name>/commit/<revision>`: the NDJSON commit (`header`, `file` with
  base64 content, `lfsFile` naming an uploaded object, `deletedFile`), applied whole or not at
  all (a missing LFS object, a size that differs, a path that climbs out: 4xx, nothing written).

Not implemented: the Xet storage protocol (the hub's default where `hf_xet` is installed: a
test's pushing process runs with HF_HUB_DISABLE_XET=1, and the client then takes the LFS path
the hub still serves), multipart LFS uploads (files past the hub's multipart size), pull
requests, branches other than `main`, and downloads: a test reads a pushed repository's files
under `root/repos/<org>/<name>/`, and its commits and visibility in `repo(...)`.

    python -m tests.hub.uploads --root DIR --port PORT --token TOKEN
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.stores import _kill_tree, _wait_until_listening
from tests.support import ThrowawayServer, free_port

LFS_THRESHOLD = 10 * 1024 * 1024
"""The hub's: a file this large or larger goes through LFS."""
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".onnx", ".msgpack")
"""Files the hub's default .gitattributes tracks with LFS, whatever their size."""
LFS_JSON = "application/vnd.git-lfs+json"


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status, headers={"X-Error-Code": code} if code
                        else None)


def create_app(root: Path, token: str, base: str) -> FastAPI:
    app = FastAPI()
    repos, objects = root / "repos", root / "lfs"

    def repo_dir(org: str, name: str) -> Path:
        return repos / org / name

    def meta(org: str, name: str) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((repo_dir(org, name) / ".hub.json").read_text())
        return loaded

    def authorized(request: Request) -> bool:
        allowed = request.headers.get("authorization") == f"Bearer {token}"
        with (root / "requests.jsonl").open("a") as log:
            log.write(json.dumps({"method": request.method, "path": request.url.path,
                                  "authorized": allowed}) + "\n")
        return allowed

    @app.post("/api/repos/create")
    async def create(request: Request) -> JSONResponse:
        if not authorized(request):
            return _error(401, "Invalid credentials in Authorization header")
        body = await request.json()
        org, name = body.get("organization"), body.get("name")
        if not org or not name or body.get("type", "model") != "model":
            return _error(400, "this test hub makes model repositories under an organization")
        folder = repo_dir(org, name)
        if folder.exists():  # the hub's answer names it, and the client reads its url
            return JSONResponse({"error": "You already created this model repo",
                                 "url": f"{base}/{org}/{name}"}, 409)
        private = body.get("visibility", "private" if body.get("private") else "public")
        folder.mkdir(parents=True)
        (folder / ".hub.json").write_text(json.dumps({"private": private != "public",
                                                      "commits": []}))
        return JSONResponse({"url": f"{base}/{org}/{name}", "name": f"{org}/{name}"})

    @app.post("/api/validate-yaml")
    async def validate_yaml(request: Request) -> JSONResponse:
        await request.json()  # the metadata is not checked here: a test reads the README
        return JSONResponse({"errors": [], "warnings": []})

    @app.post("/api/models/{org}/{name}/preupload/{revision}")
    async def preupload(org: str, name: str, revision: str, request: Request) -> JSONResponse:
        if not authorized(request):
            return _error(401, "Invalid credentials in Authorization header")
        if not repo_dir(org, name).is_dir():
            return _error(404, "Repository not found", "RepoNotFound")
        files = (await request.json())["files"]
        return JSONResponse({"files": [
            {"path": file["path"], "shouldIgnore": False, "oid": None,
             "uploadMode": ("lfs" if file["size"] >= LFS_THRESHOLD
                            or file["path"].endswith(LFS_SUFFIXES) else "regular")}
            for file in files]})

    @app.post("/{org}/{name}.git/info/lfs/objects/batch")
    async def batch(org: str, name: str, request: Request) -> JSONResponse:
        if not authorized(request):
            return _error(401, "Invalid credentials in Authorization header")
        body = await request.json()
        if body.get("operation") != "upload" or "basic" not in body.get("transfers", ["basic"]):
            return _error(400, "this test hub takes basic LFS uploads only")
        answered = []
        for item in body["objects"]:
            oid, size = item["oid"], item["size"]
            answer: dict[str, Any] = {"oid": oid, "size": size}
            if not (objects / oid).is_file():
                answer["actions"] = {
                    "upload": {"href": f"{base}/lfs-objects/{oid}", "header": {}},
                    "verify": {"href": f"{base}/{org}/{name}.git/info/lfs/objects/verify",
                               "header": {}}}
            answered.append(answer)
        return JSONResponse({"transfer": "basic", "objects": answered}, media_type=LFS_JSON)

    @app.put("/lfs-objects/{oid}")
    async def upload(oid: str, request: Request) -> JSONResponse:
        objects.mkdir(parents=True, exist_ok=True)
        partial, digest = objects / f"{oid}.partial", hashlib.sha256()
        with partial.open("wb") as handle:
            async for chunk in request.stream():
                digest.update(chunk)
                handle.write(chunk)
        if digest.hexdigest() != oid:
            partial.unlink()
            return _error(400, f"the content's SHA-256 is {digest.hexdigest()}, not {oid}")
        partial.replace(objects / oid)
        return JSONResponse({})

    @app.post("/{org}/{name}.git/info/lfs/objects/verify")
    async def verify(org: str, name: str, request: Request) -> JSONResponse:
        if not authorized(request):
            return _error(401, "Invalid credentials in Authorization header")
        body = await request.json()
        stored = objects / body["oid"]
        if not stored.is_file() or stored.stat().st_size != body["size"]:
            return _error(404, f"object {body['oid']} was not uploaded whole")
        return JSONResponse({})

    @app.post("/api/models/{org}/{name}/commit/{revision}")
    async def commit(org: str, name: str, revision: str, request: Request) -> JSONResponse:
        if not authorized(request):
            return _error(401, "Invalid credentials in Authorization header")
        folder = repo_dir(org, name)
        if not folder.is_dir():
            return _error(404, "Repository not found", "RepoNotFound")
        if revision != "main":
            return _error(400, "this test hub has one branch, main")
        lines = [json.loads(line) for line in (await request.body()).splitlines() if line]
        writes: dict[str, bytes | Path] = {}
        deletes, summary = [], ""
        for line in lines:
            key, value = line["key"], line["value"]
            path = value.get("path", "")
            if key != "header" and (not path or PurePosixPath(path).is_absolute()
                                    or ".." in PurePosixPath(path).parts):
                return _error(400, f"invalid path {path!r}")
            if key == "header":
                summary = value["summary"]
            elif key == "file":
                writes[path] = base64.b64decode(value["content"])
            elif key == "lfsFile":
                stored = objects / value["oid"]
                if not stored.is_file() or stored.stat().st_size != value["size"]:
                    return _error(422, f"LFS object {value['oid']} of {path} is not uploaded")
                writes[path] = stored
            elif key == "deletedFile":
                deletes.append(path)
            else:
                return _error(400, f"this test hub takes no {key} operations")
        for path, content in writes.items():
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content.read_bytes() if isinstance(content, Path) else content)
        for path in deletes:
            (folder / path).unlink(missing_ok=True)
        state = meta(org, name)
        oid = hashlib.sha1(json.dumps([state["commits"], lines]).encode()).hexdigest()
        state["commits"].append({"oid": oid, "summary": summary, "files": sorted(writes)})
        (folder / ".hub.json").write_text(json.dumps(state))
        return JSONResponse({"commitUrl": f"{base}/{org}/{name}/commit/{oid}",
                             "commitOid": oid, "pullRequestUrl": None})

    return app


class UploadHub(ThrowawayServer):
    """This module's server in a process of its own, on a free 127.0.0.1 port, stopped by pid."""

    def __init__(self, root: Path, token: str = "hf_test_token") -> None:
        self.root, self.token, self.port = root, token, free_port()
        self.log = root / "uploads.log"
        self.process: subprocess.Popen[bytes] | None = None
        root.mkdir(parents=True, exist_ok=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self) -> None:
        argv = [sys.executable, "-m", "tests.hub.uploads", "--root", str(self.root), "--port",
                str(self.port), "--token", self.token]
        with self.log.open("wb") as handle:
            self.process = subprocess.Popen(
                argv, cwd=Path(__file__).resolve().parents[2], stdin=subprocess.DEVNULL,
                stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        _wait_until_listening(self.process, self.port, "the upload hub", self.log)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            _kill_tree(process)

    def repo(self, repo_id: str) -> dict[str, Any]:
        """A pushed repository's visibility and commits (`private`, `commits`)."""
        state: dict[str, Any] = json.loads((self.files(repo_id) / ".hub.json").read_text())
        return state

    def files(self, repo_id: str) -> Path:
        """The folder holding the repository's files at its last commit."""
        return self.root / "repos" / repo_id

    def requests(self) -> list[dict[str, Any]]:
        log = self.root / "requests.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m tests.hub.uploads")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True)
    args = parser.parse_args()
    app = create_app(args.root, args.token, f"http://127.0.0.1:{args.port}")
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
