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

from api.backends.base import Launch
from api.backends.kubernetes.backend import cluster_config
from api.backends.kubernetes.cluster import USER_ID, ClusterConfig
from api.backends.kubernetes.coordinator import coordinator_component
from api.backends.kubernetes.labels import LIGHTHOUSE, STORE, TRAINER, labels
from api.backends.kubernetes.network import network_policy
from api.backends.kubernetes.template import trainer_container
from api.settings import Settings
from tests.api.backends.k8s_fake import SCHEMA_VERSION
from tests.api.backends.k8s_fake.store import matches, parse_selector
from tests.conftest import ROOT
from trainer.contract.artifact_store import is_local, location
from trainer.contract.spec import JobSpec

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
    # Trainers write checkpoints and models 0600 (PRIVATE_UMASK): the API reads them on the
    # shared volumes as the same user.
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (
        USER_ID, USER_ID)
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


def selects(policy_selector: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    requirements = [(k, "=", {v}) for k, v in policy_selector.get("matchLabels", {}).items()]
    requirements += [(e["key"], e["operator"].lower(), set(e.get("values", [])))
                     for e in policy_selector.get("matchExpressions", [])]
    return matches(pod_labels, requirements)


def test_network_policies_select_the_pods_the_backend_labels() -> None:
    objects = base()
    trainers = objects[("NetworkPolicy", "migrator-trainers")]["spec"]
    coordinators = objects[("NetworkPolicy", "migrator-coordinators")]["spec"]
    api = objects[("Deployment", "migrator-api")]["spec"]["template"]["metadata"]["labels"]
    trainer = labels("job-1", TRAINER)
    lighthouse = labels("job-1", LIGHTHOUSE)
    store = labels("job-1", STORE)
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
    # Nothing gets into a job's pods through these: each job's own policy lets its trainers in.
    for policy in (trainers, coordinators):
        assert policy.get("ingress") is None and "Ingress" in policy["policyTypes"]


def ingress_allowed(policies: list[dict[str, Any]], source: dict[str, str],
                    target: dict[str, str], port: int) -> bool:
    """Whether these policies of one namespace let a pod labelled `source` connect to `port`
    of a pod labelled `target` (pods in the namespace; policies add up)."""
    selecting = [p["spec"] for p in policies if selects(p["spec"]["podSelector"], target)
                 and "Ingress" in p["spec"]["policyTypes"]]
    if not selecting:
        return True  # not isolated
    return any((not rule.get("from") or any("podSelector" in peer and "namespaceSelector"
                                            not in peer and selects(peer["podSelector"], source)
                                            for peer in rule["from"]))
               and (not rule.get("ports") or any(p["port"] == port for p in rule["ports"]))
               for spec in selecting for rule in spec.get("ingress", []))


def test_only_a_jobs_own_trainers_reach_its_pods() -> None:
    objects = base()
    cluster = ClusterConfig(namespace="live-migrator", image="trainer:1")
    policies = [d for d in objects.values() if d["kind"] == "NetworkPolicy"]
    jobs = {}
    for job, mode in (("job-a", "live"), ("job-b", "restart")):
        launch = Launch(job_id=job, pods=2, fault_tolerance=mode,  # type: ignore[arg-type]
                        spec=JobSpec(), report_url="http://api", report_token="t",
                        checkpoint_dir=Path("c"), model_dir=Path("m"), inputs_dir=Path("i"),
                        cache_dir=Path("x"))
        policies.append(network_policy(launch, cluster))
        jobs[job] = {"trainer": labels(job, TRAINER),
                     "coordinator": labels(job, coordinator_component(launch))}
    api = objects[("Deployment", "migrator-api")]["spec"]["template"]["metadata"]["labels"]
    stranger = {"app": "anything-else"}
    for job, pods in jobs.items():
        other = jobs["job-b" if job == "job-a" else "job-a"]
        for target in pods.values():  # heal, gloo, store and manager ports are ephemeral
            assert ingress_allowed(policies, pods["trainer"], target, 41234)
            for source in (other["trainer"], other["coordinator"], pods["coordinator"], api,
                           stranger):
                assert not ingress_allowed(policies, source, target, 41234), (source, target)
    # The API takes reports from trainers, and nothing in the namespace gets in otherwise.
    assert ingress_allowed(policies, jobs["job-a"]["trainer"], api, 8000)
    assert not ingress_allowed(policies, jobs["job-a"]["trainer"], api, 9000)
    assert not any(ingress_allowed(policies, source, api, 8000)
                   for source in (jobs["job-a"]["coordinator"], stranger))


def test_the_api_pod_has_a_policy_of_its_own() -> None:
    objects = base()
    policy = objects[("NetworkPolicy", "migrator-api")]["spec"]
    api = objects[("Deployment", "migrator-api")]["spec"]["template"]["metadata"]["labels"]
    assert selects(policy["podSelector"], api)
    assert not any(selects(policy["podSelector"], labels("job-1", component))
                   for component in (TRAINER, LIGHTHOUSE, STORE))
    assert policy["policyTypes"] == ["Ingress", "Egress"]  # default deny both ways, and then:
    assert policy["ingress"] == [{
        "from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "live-migrator",
                                                  "app.kubernetes.io/component": "trainer"}}}],
        "ports": [{"port": 8000, "protocol": "TCP"}]}]
    dns, api_server = policy["egress"]
    assert dns["to"] == [{"namespaceSelector": {"matchLabels": {
                              "kubernetes.io/metadata.name": "kube-system"}},
                          "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}
    assert "to" not in api_server  # the API server is no pod: its address is the cluster's
    assert {(p["port"], p["protocol"]) for p in api_server["ports"]} == {(443, "TCP"),
                                                                         (6443, "TCP")}


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


@pytest.mark.parametrize("overlay", ["base", "overlays/aks", "overlays/object-store"])
def test_rendered_kustomization_validates_strictly(overlay: str) -> None:
    rendered = render(K8S / overlay)
    for doc in rendered:
        assert kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)
        if doc["kind"] in NAMESPACED:
            assert doc["metadata"]["namespace"] == "live-migrator", doc["metadata"]["name"]
    kinds = sorted(d["kind"] for d in rendered)
    assert kinds.count("PersistentVolumeClaim") == 4 and "Role" in kinds
    assert {d["metadata"]["name"] for d in rendered if d["kind"] == "NetworkPolicy"} == {
        "migrator-trainers", "migrator-coordinators", "migrator-initializers", "migrator-api",
        *(["migrator-artifacts-egress"] if overlay == "overlays/object-store" else [])}
    if overlay == "overlays/object-store":
        config = next(d for d in rendered if d["kind"] == "ConfigMap")["data"]
        assert config["MIGRATOR_ARTIFACTS_URL"].startswith("s3://")
        assert config["MIGRATOR_BACKEND"] == "kubernetes"  # the base's settings stay
    if overlay == "overlays/aks":
        classes = {d["metadata"]["name"]: d["spec"].get("storageClassName") for d in rendered
                   if d["kind"] == "PersistentVolumeClaim"}
        assert classes == {"migrator-data": "migrator-azurefile",
                           "migrator-checkpoints": "migrator-azurefile",
                           "migrator-models": "migrator-azurefile",
                           "migrator-api-data": None}  # the cluster's default (Azure Disk)
        storage_class = next(d for d in rendered if d["kind"] == "StorageClass")
        assert storage_class["provisioner"] == "file.csi.azure.com"


def egress_out_allowed(policies: list[dict[str, Any]], source: dict[str, str], port: int,
                       ) -> bool:
    """Whether these policies let a pod labelled `source` connect to `port` of an address
    outside the cluster (a cloud store): a rule naming no peers, or an ipBlock."""
    selecting = [p["spec"] for p in policies if selects(p["spec"]["podSelector"], source)
                 and "Egress" in p["spec"]["policyTypes"]]
    if not selecting:
        return True  # not isolated
    return any((not rule.get("to") or any("ipBlock" in peer for peer in rule["to"]))
               and (not rule.get("ports") or any(p["port"] == port for p in rule["ports"]))
               for spec in selecting for rule in spec.get("egress", []))


def test_the_object_store_overlay_lets_trainers_and_the_api_reach_the_store() -> None:
    overlay = K8S / "overlays" / "object-store"
    objects = base()
    settings_patch = documents(overlay / "settings.yaml")[0]
    config = {**objects[("ConfigMap", "migrator-api")]["data"], **settings_patch["data"]}
    settings = Settings.model_validate({k.removeprefix("MIGRATOR_").lower(): v
                                        for k, v in config.items()})
    assert not is_local(settings.artifacts)

    # The API reads the store's credentials from the Secret the trainer pods get.
    api = objects[("Deployment", "migrator-api")]["spec"]["template"]["spec"]["containers"][0]
    assert {"secretRef": {"name": settings.k8s_artifacts_secret, "optional": True}} in api[
        "envFrom"]
    launch = Launch(job_id="job-1", pods=2, fault_tolerance="live", spec=JobSpec(),
                    report_url="http://api", report_token="t",
                    checkpoint_dir=location(f"{settings.artifacts_url}/job-1/checkpoints"),
                    model_dir=location(f"{settings.artifacts_url}/job-1/model"),
                    inputs_dir=Path("i"), cache_dir=Path("x"))
    trainer = trainer_container(launch, cluster_config(settings))
    assert trainer["envFrom"] == [{"secretRef": {"name": settings.k8s_artifacts_secret}}]

    # HTTPS out for the trainers and the API; still nothing for the coordinators.
    base_policies = [d for d in objects.values() if d["kind"] == "NetworkPolicy"]
    policies = [*base_policies, *documents(overlay / "network-policy.yaml")]
    api_labels = objects[("Deployment", "migrator-api")]["spec"]["template"]["metadata"][
        "labels"]
    trainer_labels = labels("job-1", TRAINER)
    assert not egress_out_allowed(base_policies, trainer_labels, 443)
    assert egress_out_allowed(policies, trainer_labels, 443)
    assert not egress_out_allowed(policies, trainer_labels, 80)
    assert egress_out_allowed(policies, api_labels, 443)
    for component in (LIGHTHOUSE, STORE):
        assert not egress_out_allowed(policies, labels("job-1", component), 443)
