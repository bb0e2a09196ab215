import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from api.reconciler import Reconciler
from api.services.events import PAGE_BYTES, event_page, json_size
from tests.api.conftest import AUTH, create_job
from tests.api.fakes import FakeBackend
from tests.factories import record
from trainer.contract.records import Quorum
from trainer.contract.spec import JobSpec, LoraSpec


def test_endpoints_need_the_admin_token(client: TestClient) -> None:
    missing = client.get("/api/v1/jobs")
    assert missing.status_code == 401
    assert missing.headers["WWW-Authenticate"] == "Bearer"
    assert missing.json()["error"] == "unauthorized"
    wrong = client.get("/api/v1/jobs", headers={"Authorization": "Bearer nope"})
    assert (wrong.status_code, wrong.json()["error"]) == (403, "forbidden")
    # The token is never taken from a URL (the event stream takes signed links).
    token = AUTH["Authorization"][7:]
    assert client.get(f"/api/v1/jobs?token={token}").status_code == 401
    assert client.post(f"/api/v1/jobs?token={token}", json={}).status_code == 401


def test_create_with_defaults_launches_the_pods(client: TestClient,
                                                backend: FakeBackend) -> None:
    response = client.post("/api/v1/jobs", json={}, headers=AUTH)
    assert response.status_code == 201
    job = response.json()
    assert response.headers["Location"] == f"/api/v1/jobs/{job['id']}"
    assert job["status"] == "starting"
    # The stored spec is the contract's defaults, field for field (a new field needs no edit
    # here), and those defaults are the offline demo's: MiniLM on Rotten Tomatoes, two pods.
    assert job["spec"] == JobSpec().model_dump(mode="json")
    assert {k: job["spec"][k] for k in ("model", "dataset", "replicas", "fault_tolerance",
                                       "epochs", "parallelism", "finetune")} == {
        "model": "minilm", "dataset": "rotten_tomatoes", "replicas": 2,
        "fault_tolerance": "live", "epochs": 1, "parallelism": "data", "finetune": "full"}
    assert launch_spec(backend) == job["spec"]  # the pods get exactly the stored spec
    assert [(p["ordinal"], p["name"], p["phase"]) for p in job["pods"]] == [
        (0, f"{job['id']}-0", "Pending"), (1, f"{job['id']}-1", "Pending")]
    assert job["links"]["stream"] == f"/api/v1/jobs/{job['id']}/stream"
    assert job["links"]["cancel"] == f"/api/v1/jobs/{job['id']}/cancel"
    launch = backend.launches[0]
    assert launch.job_id == job["id"] and launch.pods == 2
    assert launch.report_url == f"http://127.0.0.1:8123/api/v1/jobs/{job['id']}/reports"
    assert len(launch.report_token) > 30 and launch.report_token not in response.text
    # A peer secret of its own, which no response shows and no other job shares.
    assert len(launch.peer_secret) > 30 and launch.peer_secret not in response.text
    assert launch.peer_secret != launch.report_token
    assert client.post("/api/v1/jobs", json={}, headers=AUTH).status_code == 201
    assert backend.launches[1].peer_secret not in (launch.peer_secret, "")


PIPELINE = {"parallelism": "pipeline", "fault_tolerance": "restart"}


@pytest.mark.parametrize(("spec", "field"), [
    ({"replicas": 0}, "replicas"),
    ({"learning_rate": 2}, "learning_rate"),
    ({"fault_tolerance": "magic"}, "fault_tolerance"),
    ({"batch_size": "lots"}, "batch_size"),
    ({"epochs": 1.5}, "epochs"),
    ({"colour": "red"}, "colour"),
    ({"dataset": "../../etc/passwd"}, "dataset"),
    ({"model": "/etc"}, "model"),
    ({"model": "tiny/../../outside"}, "model"),
    ({"dataset": "mnist"}, "dataset"),
    ({"dataset": "nothing-here.csv"}, "dataset"),
    ({"model": "not a hub id!"}, "model"),
    ({**PIPELINE, "pipeline_stages": 7}, "pipeline_stages"),  # minilm has 6 layers
    ({**PIPELINE, "pipeline_stages": 1}, "pipeline_stages"),
    ({**PIPELINE, "replicas": 9}, "pipeline_stages"),  # 18 pods
    ({**PIPELINE, "microbatches": 3}, "microbatches"),  # does not divide 16
    ({"microbatches": 8}, "microbatches"),  # a data-parallel job
    ({"schedule": "gpipe"}, "schedule"),
    ({"finetune": "lora", "lora": {"target_modules": ["query", "qkv"]}}, "lora"),
    ({"finetune": "lora", "lora": {"r": 0}}, "lora"),
    ({"lora": {"r": 4}}, "lora"),  # a full fine-tune
    ({**PIPELINE, "finetune": "lora"}, "finetune"),
    ({"quantization": "8bit"}, "quantization"),  # a full fine-tune
    ({"finetune": "lora", "quantization": "8bit"}, "quantization"),  # no CUDA here
    ({"quantization": "4bit"}, "quantization"),
])
def test_invalid_specs_are_422_naming_the_field(client: TestClient, backend: FakeBackend,
                                                 spec: dict, field: str) -> None:
    response = client.post("/api/v1/jobs", json=spec, headers=AUTH)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "invalid"
    assert field in [str(part) for error in body["detail"] for part in error["loc"]]
    assert backend.launches == []


def test_a_lora_job_gets_its_defaults_and_says_why_a_target_is_refused(
        client: TestClient) -> None:
    job = create_job(client, finetune="lora")
    assert job["spec"]["lora"] == LoraSpec().model_dump(mode="json")
    assert job["spec"]["learning_rate"] == 2e-3  # LoRA's own default
    assert create_job(client, finetune="lora", learning_rate=1e-3)["spec"][
        "learning_rate"] == 1e-3
    refused = client.post("/api/v1/jobs", headers=AUTH, json={
        "finetune": "lora", "lora": {"target_modules": ["qkv"]}})
    assert refused.status_code == 422 and "target_modules: 'qkv' not in minilm" in refused.text
    gpu = client.post("/api/v1/jobs", headers=AUTH, json={"finetune": "lora",
                                                           "quantization": "8bit"})
    assert gpu.status_code == 422 and "resources.gpus" in gpu.text
    # With a GPU per pod (the cluster backends), an 8-bit base is the trainer's to load.
    job = create_job(client, finetune="lora", quantization="8bit", resources={"gpus": 1})
    assert job["spec"]["quantization"] == "8bit"


def test_an_8bit_base_on_the_local_backend_needs_this_machines_cuda(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from api.errors import InvalidSpec
    from api.models import JobCreate
    from api.services.job_inputs import check_quantization

    spec = JobCreate(finetune="lora", quantization="8bit")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InvalidSpec, match="the local backend's machine has no CUDA GPU"):
        check_quantization(spec, "local")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_quantization(spec, "local")  # bitsandbytes is installed
    check_quantization(JobCreate(finetune="lora"), "local")


def test_a_pipeline_job_runs_replicas_times_stages_pods(client: TestClient,
                                                        backend: FakeBackend) -> None:
    job = create_job(client, **PIPELINE, replicas=2, pipeline_stages=3, microbatches=8)
    assert backend.launches[-1].pods == 6
    assert backend.launches[-1].fault_tolerance == "restart"
    assert [(p["ordinal"], p["replica"], p["stage"]) for p in job["pods"]] == [
        (0, 0, 0), (1, 0, 1), (2, 0, 2), (3, 1, 0), (4, 1, 1), (5, 1, 2)]
    scaled = client.patch(f"/api/v1/jobs/{job['id']}", json={"replicas": 3}, headers=AUTH)
    assert scaled.status_code == 422, scaled.text
    assert "pipeline" in scaled.text
    moved = client.post(f"/api/v1/jobs/{job['id']}/pods/1/migrate", headers=AUTH)
    assert moved.status_code == 409 and "pipeline" in moved.text
    # One live replica restarts as a whole (the docs say so); data jobs are unchanged.
    live = create_job(client, parallelism="pipeline", replicas=1)
    assert backend.launches[-1].fault_tolerance == "restart" and len(live["pods"]) == 2
    told = client.get(f"/api/v1/jobs/{live['id']}/events?type=job", headers=AUTH).json()
    assert [e["data"]["fault_tolerance"] for e in told["data"]
            if e["data"].get("type") == "restart_mode"] == ["restart"]
    create_job(client, parallelism="pipeline", replicas=2)  # each replica a torchft group
    assert (backend.launches[-1].fault_tolerance, backend.launches[-1].pods) == ("live", 4)
    data = create_job(client, replicas=2)
    assert [(p["replica"], p["stage"]) for p in data["pods"]] == [(0, 0), (1, 0)]


def test_local_model_and_dataset_under_inputs(client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client, model="tiny", dataset="reviews.csv")
    assert (job["spec"]["model"], job["spec"]["dataset"]) == ("tiny", "reviews.csv")
    assert job["status"] == "starting" and backend.stagings == []
    # Hub assets are staged first (tests/api/test_staging.py runs that end to end).
    assert create_job(client, model="bert-base-uncased", dataset="imdb")["status"] == "preparing"
    assert [(s.kind, s.repo_id) for s in backend.stagings] == [
        ("model", "bert-base-uncased"), ("dataset", "stanfordnlp/imdb")]


@pytest.mark.parametrize(("spec", "field", "message"), [
    ({**PIPELINE, "pipeline_stages": 3}, "pipeline_stages", "at most the model's 2 encoder"),
    ({"max_length": 256}, "max_length", "at most the model's 128 positions"),
    ({"finetune": "lora", "lora": {"target_modules": ["query", "q_lin"]}}, "lora",
     "target_modules: 'q_lin' not in the model"),
])
def test_a_spec_is_checked_against_a_local_models_config(
        client: TestClient, backend: FakeBackend, spec: dict, field: str, message: str) -> None:
    """The tiny model under the inputs dir: 2 layers, 128 positions, BERT's modules."""
    response = client.post("/api/v1/jobs", json={"model": "tiny", **spec}, headers=AUTH)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", field]
    assert message in response.json()["detail"][0]["msg"]
    assert backend.launches == []


def test_list_is_paged_and_filterable(client: TestClient) -> None:
    ids = [create_job(client, name=f"job {i}")["id"] for i in range(3)]
    page = client.get("/api/v1/jobs?limit=2", headers=AUTH).json()
    assert page["count"] == 3 and len(page["data"]) == 2
    assert [j["id"] for j in page["data"]] == ids[::-1][:2]  # newest first
    rest = client.get("/api/v1/jobs?limit=2&offset=2", headers=AUTH).json()
    assert [j["id"] for j in rest["data"]] == [ids[0]]
    assert client.get("/api/v1/jobs?status=succeeded", headers=AUTH).json()["count"] == 0


def test_the_list_shows_each_job_with_its_own_pods(client: TestClient) -> None:
    ids = [create_job(client, replicas=replicas)["id"] for replicas in (1, 3, 2)]
    listed = {j["id"]: j["pods"] for j in client.get("/api/v1/jobs", headers=AUTH).json()["data"]}
    ordinals = [[pod["ordinal"] for pod in listed[job_id]] for job_id in ids]
    assert ordinals == [[0], [0, 1, 2], [0, 1]]
    for job_id in ids:  # as the job's own page shows them
        assert listed[job_id] == client.get(f"/api/v1/jobs/{job_id}", headers=AUTH).json()["pods"]


def launch_spec(backend: FakeBackend) -> dict:
    """The spec the pods get, as JSON."""
    return backend.launches[-1].spec.model_dump(mode="json")


def test_unknown_job_is_404(client: TestClient) -> None:
    for method, path in (("get", "/api/v1/jobs/job-nope"), ("delete", "/api/v1/jobs/job-nope"),
                         ("post", "/api/v1/jobs/job-nope/cancel"),
                         ("get", "/api/v1/jobs/job-nope/events"),
                         ("post", "/api/v1/jobs/job-nope/pods/0/kill")):
        response = client.request(method, path, headers=AUTH)
        assert response.status_code == 404, path
        assert response.json() == {"error": "not_found", "detail": "job job-nope not found"}


def test_cancel_deletes_the_workload_once(client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client)
    response = client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH)
    assert response.status_code == 202
    assert backend.deleted == [job["id"]]
    assert client.get(f"/api/v1/jobs/{job['id']}", headers=AUTH).json()["status"] == "cancelled"
    again = client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH)
    assert again.status_code == 409 and "already cancelled" in again.json()["detail"]


def test_delete_removes_an_ended_job_and_keeps_its_artifacts_unless_asked(
        client: TestClient, backend: FakeBackend, settings) -> None:
    kept, purged = create_job(client), create_job(client)
    running = client.delete(f"/api/v1/jobs/{kept['id']}", headers=AUTH)
    assert running.status_code == 409 and "cancel it first" in running.json()["detail"]
    for job in (kept, purged):
        client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH)
        (settings.jobs_dir / job["id"] / "checkpoints" / "step-5").mkdir(parents=True)

    assert client.delete(f"/api/v1/jobs/{kept['id']}", headers=AUTH).status_code == 204
    assert client.get(f"/api/v1/jobs/{kept['id']}", headers=AUTH).status_code == 404
    assert client.get(f"/api/v1/jobs/{kept['id']}/events", headers=AUTH).status_code == 404
    assert (settings.jobs_dir / kept["id"] / "checkpoints" / "step-5").is_dir()
    assert client.delete(f"/api/v1/jobs/{kept['id']}", headers=AUTH).status_code == 404

    deleted = client.delete(f"/api/v1/jobs/{purged['id']}?delete_artifacts=true", headers=AUTH)
    assert deleted.status_code == 204
    assert not (settings.jobs_dir / purged["id"]).exists()
    assert [j["id"] for j in client.get("/api/v1/jobs", headers=AUTH).json()["data"]] == []


def test_kill_a_pod(client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client)
    path = f"/api/v1/jobs/{job['id']}/pods"
    response = client.post(f"{path}/1/kill", json={"grace_seconds": 0}, headers=AUTH)
    assert response.status_code == 202
    assert backend.kills == [(job["id"], 1, 0.0)]
    assert client.post(f"{path}/1/kill", headers=AUTH).status_code == 202  # body optional
    events = client.get(f"/api/v1/jobs/{job['id']}/events?type=pod", headers=AUTH).json()
    kill = events["data"][0]
    assert (kill["data"]["action"], kill["data"]["ordinal"], kill["data"]["by"]) == (
        "kill", 1, "admin")
    assert kill["time"] > 0
    missing = client.post(f"{path}/2/kill", headers=AUTH)
    assert missing.status_code == 404 and "no pod 2" in missing.json()["detail"]
    bad = client.post(f"{path}/0/kill", json={"grace_seconds": -1}, headers=AUTH)
    assert bad.status_code == 422
    client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=AUTH)
    late = client.post(f"{path}/0/kill", headers=AUTH)
    assert late.status_code == 409 and "not running" in late.json()["detail"]


def test_pod_logs(client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client)
    backend.logs[(job["id"], 1)] = [f"line {i}" for i in range(10)]
    path = f"/api/v1/jobs/{job['id']}/pods"
    assert client.get(f"{path}/1/logs?lines=3", headers=AUTH).json() == {
        "lines": ["line 7", "line 8", "line 9"]}
    assert client.get(f"{path}/0/logs", headers=AUTH).json() == {"lines": []}
    assert client.get(f"{path}/5/logs", headers=AUTH).status_code == 404
    assert client.get(f"{path}/1/logs?lines=0", headers=AUTH).status_code == 422


def test_launch_failure_keeps_the_job_as_failed(client: TestClient,
                                                backend: FakeBackend) -> None:
    backend.fail_launch = "supervisor would not start"
    response = client.post("/api/v1/jobs", json={}, headers=AUTH)
    assert response.status_code == 503
    assert "supervisor would not start" in response.json()["detail"]
    jobs = client.get("/api/v1/jobs", headers=AUTH).json()["data"]
    assert jobs[0]["status"] == "failed" and "launch failed" in jobs[0]["reason"]


def test_an_os_error_while_launching_fails_the_job_with_503(client: TestClient,
                                                             backend: FakeBackend) -> None:
    def cannot_create_the_directory(launch: object) -> None:
        raise PermissionError(13, "Permission denied", "/data/jobs/job-x")

    backend.launch = cannot_create_the_directory  # type: ignore[method-assign]
    response = client.post("/api/v1/jobs", json={}, headers=AUTH)
    assert response.status_code == 503, response.text
    assert "Permission denied" in response.json()["detail"]
    job = client.get("/api/v1/jobs", headers=AUTH).json()["data"][0]
    assert job["status"] == "failed" and "Permission denied" in job["reason"]
    assert job["finished_at"] is not None


def test_events_are_paged_with_after(client: TestClient) -> None:
    job = create_job(client)
    for ordinal in (0, 1, 0):
        client.post(f"/api/v1/jobs/{job['id']}/pods/{ordinal}/kill", headers=AUTH)
    first = client.get(f"/api/v1/jobs/{job['id']}/events?limit=2", headers=AUTH).json()
    assert len(first["data"]) == 2 and first["next_after"] == first["data"][-1]["id"]
    rest = client.get(f"/api/v1/jobs/{job['id']}/events?after={first['next_after']}",
                      headers=AUTH).json()
    ids = [e["id"] for e in first["data"] + rest["data"]]
    assert ids == sorted(ids) and len(set(ids)) == len(ids) and rest["next_after"] is None


def test_the_newest_events_come_first_and_older_ones_with_next_before(
        client: TestClient) -> None:
    job = create_job(client)
    for ordinal in (0, 1, 0, 1):
        client.post(f"/api/v1/jobs/{job['id']}/pods/{ordinal}/kill", headers=AUTH)
    url = f"/api/v1/jobs/{job['id']}/events"
    every = [e["id"] for e in client.get(url, headers=AUTH).json()["data"]]
    assert len(every) >= 6

    newest = client.get(f"{url}?newest=true&limit=2", headers=AUTH).json()
    assert [e["id"] for e in newest["data"]] == every[-2:]  # the newest two, oldest first
    assert newest["next_before"] == every[-2] and newest["next_after"] is None
    older = client.get(f"{url}?newest=true&limit=3&before={newest['next_before']}",
                       headers=AUTH).json()
    assert [e["id"] for e in older["data"]] == every[-5:-2]
    oldest = client.get(f"{url}?newest=true&limit=1000&before={older['next_before']}",
                        headers=AUTH).json()
    assert [e["id"] for e in oldest["data"]] == every[:-5] and oldest["next_before"] is None
    kills = client.get(f"{url}?newest=true&type=pod&limit=1", headers=AUTH).json()
    assert [e["data"]["ordinal"] for e in kills["data"]] == [1]  # the filters still apply
    assert client.get(f"{url}?newest=maybe", headers=AUTH).status_code == 422


def post_big_events(client: TestClient, backend: FakeBackend, job_id: str, count: int) -> None:
    """`count` events of about 9 KB each, as a pod may send them."""
    token = next(launch.report_token for launch in backend.launches if launch.job_id == job_id)
    records = [record(seq, Quorum(message="q" * 9_000, quorum_id=seq, participants=2, step=seq))
               for seq in range(1, count + 1)]
    response = client.post(f"/api/v1/jobs/{job_id}/reports",
                           headers={"Authorization": f"Bearer {token}"},
                           json={"pod": f"{job_id}-0", "incarnation": "i", "records": records})
    assert response.status_code == 200, response.text


def test_event_pages_are_bounded_in_bytes(client: TestClient, backend: FakeBackend) -> None:
    job = create_job(client)
    post_big_events(client, backend, job["id"], 300)  # 2.7 MB
    seen, quorums, after, pages = [], 0, 0, 0
    while after is not None:
        page = client.get(f"/api/v1/jobs/{job['id']}/events?after={after}&limit=1000",
                          headers=AUTH).json()
        assert sum(json_size(e["data"]) for e in page["data"]) <= PAGE_BYTES
        seen += [e["id"] for e in page["data"]]
        quorums += sum(e["data"].get("type") == "quorum" for e in page["data"])
        after, pages = page["next_after"], pages + 1
        assert after is None or after == seen[-1]
    assert pages >= 3 and seen == sorted(set(seen))
    # Every reported event once, besides the job's own (created, starting, running, and the
    # pods' phases, should a reconcile pass record them meanwhile).
    assert quorums == 300 and len(seen) >= 300 + 3
    with Session(client.app.state.engine) as session:  # type: ignore[attr-defined]
        events, next_after = event_page(session, job["id"], 0, 1000, budget=1)
        newest, next_before = event_page(session, job["id"], 0, 1000, budget=1, newest=True)
    assert len(events) == 1 and next_after == events[0].id  # a page holds one event at least
    assert [e.id for e in newest] == [seen[-1]] and next_before == seen[-1]


def test_pending_jobs_at_start_up_are_failed(client: TestClient, backend: FakeBackend,
                                             settings) -> None:
    from sqlmodel import Session

    from api.models import Job, JobStatus

    engine = client.app.state.engine
    with Session(engine) as session:
        session.add(Job(id="job-stuck", spec=JobSpec(replicas=1), report_token_hash="x"))
        session.commit()
    Reconciler(engine, settings, backend, client.app.state.events).fail_unlaunched()
    stuck = client.get("/api/v1/jobs/job-stuck", headers=AUTH).json()
    assert stuck["status"] == JobStatus.failed and "before the job was launched" in stuck["reason"]
