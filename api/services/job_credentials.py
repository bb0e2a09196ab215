"""Each job's own credential for its artifacts in Azure Blob (`MIGRATOR_ARTIFACTS_PER_JOB`).

Otherwise every pod holds the store's credentials, and with them every job's artifacts (with an
account key, the whole storage account). A blob SAS covers a container or one blob, never a
prefix (a directory SAS needs an account with a hierarchical namespace), so each job gets a
container of its own (api.services.artifacts) and its pods a service SAS for it: read, add,
create, write, delete and list there, nothing anywhere else.

The SAS carries no expiry of its own: it names the container's stored access policy, whose
expiry the control plane moves on while the job runs (`Renewals`, from the reconciler), and
which it deletes when the job ends, revoking the SAS (Azure applies such a change within 30 s).
Pods therefore keep one credential however long the job runs, and a job never outlives its
credential by more than `artifacts_credential_lifetime` once the control plane is gone.
A SAS is signed with the storage account's key: the API needs it (a connection string with
`AccountKey`, or AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from azure.core.exceptions import AzureError, ResourceExistsError, ResourceNotFoundError
from azure.storage.blob import (
    AccessPolicy,
    BlobServiceClient,
    ContainerSasPermissions,
    generate_container_sas,
)
from sqlmodel import Session, col, select
from upath import UPath

from api.models import ACTIVE_STATUSES, FINISHED_STATUSES, Job, utc_now
from api.services.artifacts import artifacts_dir
from api.settings import Settings

logger = logging.getLogger(__name__)

POLICY = "pods"
"""The stored access policy of a job's container that its pods' SAS names."""
PERMISSIONS = ContainerSasPermissions(read=True, add=True, create=True, write=True,
                                      delete=True, list=True)
VARIABLE = "AZURE_STORAGE_CONNECTION_STRING"
"""How the pods get their SAS: the variable adlfs reads, with the SAS instead of a key."""
RETRY_SECONDS = 30.0


class CredentialError(Exception):
    """No job credential can be made (no account key, the store refused)."""


def _service(settings: Settings) -> BlobServiceClient:
    """A client with the API's own credentials, as adlfs read them from the environment."""
    fs = settings.artifacts.fs if isinstance(settings.artifacts, UPath) else None
    client = None
    if fs is not None and fs.connection_string:
        client = BlobServiceClient.from_connection_string(fs.connection_string)
    elif fs is not None and fs.account_name and fs.account_key:
        client = BlobServiceClient(
            f"https://{fs.account_name}.blob.core.windows.net",
            credential={"account_name": fs.account_name, "account_key": fs.account_key})
    if client is None or not getattr(client.credential, "account_key", None):
        raise CredentialError(
            "a job's SAS is signed with the storage account's key: give the API "
            "AZURE_STORAGE_CONNECTION_STRING with an AccountKey, or AZURE_STORAGE_ACCOUNT_NAME "
            "and AZURE_STORAGE_ACCOUNT_KEY")
    return client


def _container(settings: Settings, job_id: str) -> str:
    directory = artifacts_dir(settings, job_id)
    assert isinstance(directory, UPath), directory
    return directory.path.strip("/")


def _policy(settings: Settings) -> dict[str, AccessPolicy]:
    expiry = datetime.now(UTC) + timedelta(seconds=settings.artifacts_credential_lifetime)
    return {POLICY: AccessPolicy(permission=PERMISSIONS, expiry=expiry)}


def grant(settings: Settings, job_id: str) -> dict[str, str]:
    """Create the job's container and its policy; the pods' environment for it (the SAS)."""
    container = _container(settings, job_id)
    try:
        with _service(settings) as service:
            client = service.get_container_client(container)
            with contextlib.suppress(ResourceExistsError):
                client.create_container()
            client.set_container_access_policy(signed_identifiers=_policy(settings))
            sas = generate_container_sas(service.account_name or "", container,
                                         account_key=service.credential.account_key,
                                         policy_id=POLICY)
            endpoint = service.primary_endpoint
    except AzureError as exc:
        raise CredentialError(f"cannot prepare container {container}: {exc}") from None
    logger.info("job %s: its pods get a SAS for container %s alone", job_id, container)
    return {VARIABLE: f"BlobEndpoint={endpoint};SharedAccessSignature={sas}"}


def extend(settings: Settings, job_id: str) -> None:
    """Move the job's SAS expiry `artifacts_credential_lifetime` from now."""
    with _service(settings) as service:
        service.get_container_client(_container(settings, job_id)).set_container_access_policy(
            signed_identifiers=_policy(settings))


def revoke(settings: Settings, job_id: str) -> None:
    """Delete the job's policy: its SAS stops working (nothing to do once the container is
    deleted)."""
    with _service(settings) as service, contextlib.suppress(ResourceNotFoundError):
        service.get_container_client(_container(settings, job_id)).set_container_access_policy(
            signed_identifiers={})


class Renewals:
    """The reconciler's part: extend the SAS of jobs that run once half its lifetime is gone
    (each once after a start), revoke the SAS of jobs that ended within its lifetime (each once
    per process); failures are retried."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._extend_at: dict[str, float] = {}
        """Per job seen running, the monotonic time of its next extension."""
        self._revoked: set[str] = set()

    def keep(self, session: Session) -> None:
        lifetime = self.settings.artifacts_credential_lifetime
        cutoff = utc_now() - timedelta(seconds=lifetime)
        ended = set(session.exec(select(Job.id).where(
            col(Job.status).in_(FINISHED_STATUSES), col(Job.finished_at) > cutoff)))
        self._revoked &= ended  # older ones have expired
        for job_id in ended - self._revoked:
            self._extend_at.pop(job_id, None)
            if self._done(revoke, job_id):
                self._revoked.add(job_id)
        now = time.monotonic()
        for job_id in session.exec(select(Job.id).where(col(Job.status).in_(ACTIVE_STATUSES))):
            if self._extend_at.get(job_id, now) <= now:
                self._extend_at[job_id] = now + (
                    lifetime / 2 if self._done(extend, job_id) else RETRY_SECONDS)

    def _done(self, action: Callable[[Settings, str], None], job_id: str) -> bool:
        try:
            action(self.settings, job_id)
        except (AzureError, CredentialError) as exc:
            logger.warning("job %s: cannot %s its SAS (retried): %s", job_id, action.__name__,
                           exc)
            return False
        return True
