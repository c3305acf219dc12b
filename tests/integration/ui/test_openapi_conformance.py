"""Schemathesis against a live API (the UI's server, in-process, on real PostgreSQL):
every operation of ``/api/openapi.json``, with an API token, with a password, and with
no credentials, and no answer may be a 5xx or stray from the document (status,
content type, body schema)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from beat.models import Role
from beat.ops.schedules import Schedules
from tests.integration.ui import test_ui_http
from tests.integration.ui.test_ui_http import PASSWORD, UI, USER, basic

pytestmark = pytest.mark.integration

#: The UI's fixtures, shared with the tests of its pages.
app, serve, schedules = test_ui_http.app, test_ui_http.serve, test_ui_http.schedules

#: What the document promises of every answer.
CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
    )
)
SCHEMATHESIS = Path(sys.executable).parent / "st"


def _document(ui: UI, token: str, into: Path) -> Path:
    request = urllib.request.Request(ui.base + "/api/openapi.json")
    request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        document = json.load(response)
    assert document["openapi"] == "3.1.0"
    path = into / "openapi.json"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.timeout(600)
@pytest.mark.parametrize("credentials", ["token", "password", "none"])
def test_every_operation_answers_as_its_document_says_and_never_with_a_5xx(
    serve: Callable[..., UI], schedules: Schedules, tmp_path: Path, credentials: str
) -> None:
    schedules.create("nightly", "ui.job", cron="30 2 * * *", args=["x"])
    token = schedules.create_token("schemathesis", Role.ADMIN)
    ui = serve(users={USER: PASSWORD})
    document = _document(ui, token, tmp_path)
    header = {
        "token": ["-H", f"Authorization: Bearer {token}"],
        "password": ["-H", f"Authorization: {basic(USER, PASSWORD)}"],
        "none": [],
    }[credentials]

    done = subprocess.run(
        [
            str(SCHEMATHESIS),
            "run",
            str(document),
            "--url",
            ui.base,
            *header,
            "--checks",
            CHECKS,
            "--max-examples",
            "25",
            "--seed",
            "20261207",
            "--generation-deterministic",
        ],
        cwd=tmp_path,  # its cache of examples stays out of the checkout
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )

    summary = done.stdout[-4000:]
    print(summary)
    assert done.returncode == 0, summary + done.stderr[-2000:]
    assert "passed" in summary
