"""Push a succeeded job's model to the Hugging Face hub: the initializer's `push` kind.

    python -m trainer.initializer push org/name --revision JOB_ID --inputs DIR \
        --spec '{"model_dir": PATH_OR_URL, "private": true, "message": "..."}'

The job's spec asked for it (`export.hub_repo`); the control plane starts it once the model is
in the registry. It runs where initializers run, the one kind of process with the hub token
(HF_TOKEN) and a way out; trainer pods have neither. The repository is created where missing
(private unless the spec says otherwise), and every file of the exported model (a LoRA job's
adapter folder among them) goes in one commit, through the hub client's upload protocol. Links
in the model's folder are never followed. `hub/pushes/<org>/<name>/<job>/staged.json` then names
the commit, so that the same job's model is pushed once.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from upath import UPath

from trainer.contract import artifact_store
from trainer.contract.staged import Report, staged, staged_dir, write_staged


def push(repo_id: str, job_id: str, options_json: str, inputs: Path, report: Report,
         ) -> Path:
    """Push the model the options name (unless this job's was pushed) and return the folder
    whose staged.json names the commit."""
    done = staged(inputs, "push", repo_id, job_id)
    if done is not None:
        report(state="succeeded", already=True)
        return done
    options: dict[str, Any] = json.loads(options_json)
    source = artifact_store.location(options["model_dir"])
    with tempfile.TemporaryDirectory(prefix="push-") as scratch:
        folder = source if isinstance(source, Path) else Path(scratch) / "model"
        if isinstance(source, UPath):
            artifact_store.download(source, folder)
        commit, names, size = _commit(repo_id, folder, bool(options.get("private", True)),
                                      options.get("message") or f"Live Migrator job {job_id}",
                                      report)
    target = staged_dir(inputs, "push", repo_id, job_id)
    write_staged(target, {"kind": "push", "repo_id": repo_id, "revision": job_id,
                          "commit": commit.oid, "url": commit.commit_url, "files": names,
                          "bytes": size, "staged_at": time.time()})
    report(state="succeeded", bytes_done=size, commit=commit.oid)
    return target


def _commit(repo_id: str, folder: Path, private: bool, message: str,
            report: Report) -> tuple[Any, list[str], int]:
    """(the hub's CommitInfo, the files, their bytes) of one commit of `folder`'s files."""
    from huggingface_hub import CommitOperationAdd, HfApi

    found = list(artifact_store.files(folder))  # links left out
    if not found:
        raise FileNotFoundError(f"no model files in {folder}")
    size = sum(path.stat().st_size for _, path in found)
    report(bytes_total=size, files=len(found))
    api = HfApi()
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path))
                  for name, path in found]
    commit = api.create_commit(repo_id, operations, commit_message=message, repo_type="model")
    return commit, [name for name, _ in found], size
