"""The OpenAPI document is made from the handlers: every method under /api/ is in it,
each write with the role it needs, each operation once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from beat.ui import openapi, rest_input
from beat.ui.server import UISettings, make_application


def _application() -> object:
    return make_application(None, UISettings())  # type: ignore[arg-type]


def test_every_api_handler_method_is_documented() -> None:
    assert openapi.undocumented(_application()) == []  # type: ignore[arg-type]


def test_each_operation_is_named_once_and_each_write_says_its_role() -> None:
    document = openapi.document(_application())  # type: ignore[arg-type]
    operations = [
        (path, method, body)
        for path, methods in document["paths"].items()
        for method, body in methods.items()
    ]
    names = Counter(body["operationId"] for _, _, body in operations)
    assert max(names.values()) == 1, names
    roles = {
        (path, method): body["description"] for path, method, body in operations if method != "get"
    }
    assert roles[("/api/schedules", "post")] == "Role: admin or above."
    assert roles[("/api/schedules/{name}/{action}", "post")] == "Role: operator or above."
    action = document["paths"]["/api/schedules/{name}/{action}"]["post"]["parameters"][1]
    assert action["schema"]["enum"] == ["pause", "resume", "trigger", "backfill", "restore"]


def test_a_write_s_body_lists_the_fields_the_api_reads() -> None:
    document = openapi.document(_application())  # type: ignore[arg-type]
    body = document["paths"]["/api/schedules"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert set(schema["properties"]) == set(rest_input.FIELDS)


def test_the_reference_page_lists_the_operations_of_the_document() -> None:
    """docs/reference/http-api.md holds ``openapi.markdown`` of the document: regenerate
    it between its markers when an operation changes."""
    page = (Path(__file__).parents[3] / "docs" / "reference" / "http-api.md").read_text()
    shown = page.split("<!-- operations: made by beat.ui.openapi.markdown -->\n")[1]
    shown = shown.split("<!-- end of operations -->")[0]
    assert shown == openapi.markdown(openapi.document(_application()))  # type: ignore[arg-type]
