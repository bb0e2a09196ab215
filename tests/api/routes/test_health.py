from fastapi.testclient import TestClient

from tests.api.conftest import create_job


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready", "backend": "fake"}


def test_prometheus_metrics(client: TestClient) -> None:
    create_job(client)
    text = client.get("/metrics").text
    assert 'migrator_jobs{status="starting"} 1.0' in text
    assert "migrator_sse_clients 0.0" in text
    assert 'migrator_http_request_duration_seconds_count{method="POST",route="/api/v1/jobs"' \
           ',status="201"}' in text
    assert "migrator_report_records_ingested_total" in text


def test_openapi_is_served(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert "/api/v1/jobs/{job_id}/pods/{ordinal}/kill" in spec["paths"]


def test_every_operation_documents_the_token_it_takes(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    schemes = {(method.upper(), path): sorted(name for entry in operation.get("security", [])
                                              for name in entry)
               for path, operations in spec["paths"].items()
               for method, operation in operations.items()}
    assert set(spec["components"]["securitySchemes"]) == {"AdminToken", "ReportToken"}
    for (method, path), names in schemes.items():
        if path.endswith("/reports"):
            expected = ["ReportToken"]
        elif path == "/api/v1/login":  # the login code in its body is the credential
            expected = []
        elif path.startswith("/api/v1/"):
            expected = ["AdminToken"]
        else:  # health, readiness, metrics, the dashboard
            expected = []
        assert names == expected, (method, path)
    parameters = {(method.upper(), path): {p["name"] for p in operation.get("parameters", [])}
                  for path, operations in spec["paths"].items()
                  for method, operation in operations.items()}
    assert not any("token" in names for names in parameters.values())  # in no URL
    for path in ("/api/v1/jobs/{job_id}/stream", "/api/v1/models/{model_id}/download"):
        assert {"expires", "signature"} <= parameters[("GET", path)]  # or a signed link
