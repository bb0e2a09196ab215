"""k8s/: every document valid against the official schemas (strict), and consistent with the
backend's manifests and settings; the kustomize render where a kubectl is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from api.backends import manifests
from api.settings import Settings
from tests.api.backends.k8s_fake import SCHEMA_VERSION
from tests.api.backends.k8s_fake.store import matches, parse_selector
from tests.conftest import ROOT

K8S = ROOT / "k8s"
NAMESPACED = {"ConfigMap", "Deployment", "Service", "ServiceAccount", "Role", "RoleBinding",
              "PersistentVolumeClaim", "NetworkPolicy"}


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def base() -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for path in sorted((K8S / "base").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            found |= {(d["kind"], d["metadata"]["name"]): d for d in documents(path)}
    return found


def resource_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


@pytest.mark.parametrize("path", resource_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_every_document_validates_strictly(path: Path) -> None:
    docs = documents(path)
    assert docs
    for doc in docs:
        assert kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)


def test_kustomizations_list_every_file() -> None:
    for kustomization in K8S.rglob("kustomization.yaml"):
        spec = yaml.safe_load(kustomization.read_text())
        listed = {*spec.get("resources", []), *spec.get("patchesStrategicMerge", [])}
        files = {p.name for p in kustomization.parent.glob("*.yaml")} - {"kustomization.yaml"}
        assert files == {f for f in listed if f.endswith(".yaml")}, kustomization


def test_api_deployment_mounts_what_the_backend_expects() -> None:
    objects = base()
    config = objects[("ConfigMap", "migrator-api")]["data"]
    deployment = objects[("Deployment", "migrator-api")]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # one SQLite writer
    assert pod["serviceAccountName"] == "migrator-api"
    settings = Settings.model_validate({k.removeprefix("MIGRATOR_").lower(): v
                                        for k, v in config.items()})
    assert settings.backend == "kubernetes"
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
              if "persistentVolumeClaim" in v}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = settings.resolved_volumes_dir
    # The API sees each PVC whole where the backend links jobs to (volume_dirs) ...
    assert (claims["checkpoints"], Path(mounts["checkpoints"])) == (
        settings.k8s_checkpoints_claim, volumes / "checkpoints")
    assert (claims["models"], Path(mounts["models"])) == (settings.k8s_models_claim,
                                                         volumes / "models")
    assert (claims["inputs"], Path(mounts["inputs"])) == (settings.k8s_data_claim,
                                                         settings.resolved_inputs_dir)
    assert claims["data"] == "migrator-api-data" and Path(mounts["data"]) == settings.data_dir
    # ... inside the data dir, where registered models must lie.
    assert volumes.is_relative_to(settings.data_dir.resolve())
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    service = objects[("Service", "migrator-api")]
    assert matches(deployment["spec"]["template"]["metadata"]["labels"],
                   parse_selector(",".join(f"{k}={v}"
                                           for k, v in service["spec"]["selector"].items())))
    assert settings.base_url == f"http://{service['metadata']['name']}:" \
                                f"{service['spec']['ports'][0]['port']}"


def test_claims_and_settings_defaults_agree() -> None:
    objects, defaults = base(), Settings()
    for claim in (defaults.k8s_data_claim, defaults.k8s_checkpoints_claim,
                  defaults.k8s_models_claim):
        assert objects[("PersistentVolumeClaim", claim)]["spec"]["accessModes"] == [
            "ReadWriteMany"]
    assert objects[("PersistentVolumeClaim", "migrator-api-data")]["spec"]["accessModes"] == [
        "ReadWriteOnce"]
    assert objects[("Namespace", defaults.k8s_namespace)]


def selects(policy_selector: dict[str, Any], labels: dict[str, str]) -> bool:
    requirements = [(k, "=", {v}) for k, v in policy_selector.get("matchLabels", {}).items()]
    requirements += [(e["key"], e["operator"].lower(), set(e.get("values", [])))
                     for e in policy_selector.get("matchExpressions", [])]
    return matches(labels, requirements)


def test_network_policies_select_the_pods_the_backend_labels() -> None:
    objects = base()
    trainers = objects[("NetworkPolicy", "migrator-trainers")]["spec"]
    coordinators = objects[("NetworkPolicy", "migrator-coordinators")]["spec"]
    api = objects[("Deployment", "migrator-api")]["spec"]["template"]["metadata"]["labels"]
    trainer = manifests.labels("job-1", manifests.TRAINER)
    lighthouse = manifests.labels("job-1", manifests.LIGHTHOUSE)
    store = manifests.labels("job-1", manifests.STORE)
    assert selects(trainers["podSelector"], trainer)
    assert not any(selects(trainers["podSelector"], x) for x in (lighthouse, store, api))
    assert selects(coordinators["podSelector"], lighthouse)
    assert selects(coordinators["podSelector"], store)
    assert not selects(coordinators["podSelector"], trainer)
    peers = [p for rule in trainers["egress"] for p in rule["to"] if "podSelector" in p
             and "namespaceSelector" not in p]
    for target in (api, trainer, lighthouse, store):  # the API, each other, their coordinator
        assert any(selects(p["podSelector"], target) for p in peers)
    assert not any(selects(p["podSelector"], {"app": "anything-else"}) for p in peers)
    assert coordinators.get("egress") is None and "Egress" in coordinators["policyTypes"]


def kubectl() -> str | None:
    return shutil.which("kubectl")


def render(directory: Path) -> list[dict[str, Any]]:
    found = kubectl()
    if found is None:
        pytest.skip("kubectl is not installed (Debian: apt-get install kubernetes-client); "
                    "k8s/ kustomizations not rendered")
    result = subprocess.run([found, "kustomize", str(directory)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@pytest.mark.parametrize("overlay", ["base", "overlays/aks"])
def test_rendered_kustomization_validates_strictly(overlay: str) -> None:
    rendered = render(K8S / overlay)
    for doc in rendered:
        assert kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)
        if doc["kind"] in NAMESPACED:
            assert doc["metadata"]["namespace"] == "live-migrator", doc["metadata"]["name"]
    kinds = sorted(d["kind"] for d in rendered)
    assert kinds.count("PersistentVolumeClaim") == 4 and "Role" in kinds
    if overlay == "overlays/aks":
        classes = {d["metadata"]["name"]: d["spec"].get("storageClassName") for d in rendered
                   if d["kind"] == "PersistentVolumeClaim"}
        assert classes == {"migrator-data": "migrator-azurefile",
                           "migrator-checkpoints": "migrator-azurefile",
                           "migrator-models": "migrator-azurefile",
                           "migrator-api-data": None}  # the cluster's default (Azure Disk)
        storage_class = next(d for d in rendered if d["kind"] == "StorageClass")
        assert storage_class["provisioner"] == "file.csi.azure.com"
