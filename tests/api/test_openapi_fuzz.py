"""schemathesis against the app's own OpenAPI: no generated input gets a 5xx, and every
answer is one its operation documents (status code, content type, body schema)."""

from __future__ import annotations

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.app import create_app
from api.settings import Settings
from tests.api.conftest import AUTH
from tests.api.fakes import FakeBackend

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]


def test_generated_inputs_get_documented_answers(settings: Settings) -> None:
    # schemathesis' pytest plugin does not run on pytest 9; its strategies do, with hypothesis.
    app = create_app(settings, FakeBackend())
    with TestClient(app) as client:  # runs the lifespan: tables exist
        client.post("/api/v1/jobs", json={"model": "tiny", "dataset": "reviews.csv"},
                    headers=AUTH)
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        # The stream never ends by design; it has its own tests.
        operations = [result.ok() for result in
                      schema.exclude(path_regex=r"/stream$").get_all_operations()]
        assert len(operations) >= 15
        failures: list[str] = []
        for operation in operations:

            @given(case=operation.as_strategy())
            @hypothesis_settings(max_examples=25, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            def check(case: schemathesis.Case) -> None:
                response = case.call(headers={**(case.headers or {}), **AUTH})
                try:
                    case.validate_response(response, checks=CHECKS)
                except (AssertionError, BaseExceptionGroup) as exc:  # a check failed
                    failures.append(f"{case.method} {case.formatted_path} -> "
                                    f"{response.status_code}: {str(exc)[:300]}")

            check()
        assert failures == []
