"""Where a trained model goes besides the registry: the job spec's `export` (its hub push)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def _no_double_dots(value: str) -> str:
    if ".." in value:
        raise ValueError("must not contain '..'")
    return value


HubRepo = Annotated[str, Field(max_length=96,
                               pattern=r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$"),
                    AfterValidator(_no_double_dots)]
"""A hub repository id with its namespace: `org/name`."""


class HubExport(BaseModel):
    """Where the trained model goes once the job succeeds, besides the model registry."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    hub_repo: HubRepo
    """A Hugging Face hub model repository (`org/name`), created if missing; the model (and a
    LoRA job's adapter) is pushed to it in one commit. The token is the control plane's
    (HF_TOKEN; on Kubernetes the Secret MIGRATOR_K8S_HUB_TOKEN_SECRET names), never the
    spec's."""
    private: bool = True
    """Whether a repository created for the push is private (an existing one keeps its
    visibility)."""
