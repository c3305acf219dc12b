"""The Prometheus alerting rules and the Grafana dashboard shipped in ``deploy/``: the
rules are valid and each alert is unit tested (``promtool``, Debian's ``prometheus``
package), every expression names only metrics the code exports, and every exported
metric is documented."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from beat.metrics import REGISTRY
from tests.conftest import not_installed

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "habeat-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "habeat-rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "habeat-dashboard.json"
REFERENCE = ROOT / "docs" / "reference" / "metrics.md"
#: A metric of ours named in an expression.
OUR_METRIC = re.compile(r"\bhabeat_[a-z_]+\b")
#: The samples Prometheus scrapes of a metric family, by its type.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        not_installed("promtool is not installed: apt-get install -y prometheus")
    return found


def exported_samples() -> set[str]:
    """Every sample name our endpoints can serve (a family with labels serves none until
    a value is set, so the names come from the family's type)."""
    return {
        family.name + suffix
        for family in REGISTRY.collect()
        if family.name.startswith("habeat_")
        for suffix in SUFFIXES[family.type]
    }


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def test_the_rules_are_valid_for_prometheus() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_fires_and_stays_quiet_as_its_unit_tests_expect() -> None:
    done = subprocess.run(
        [promtool(), "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        check=False,
        cwd=RULE_TESTS.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_unit_test_that_sees_it_fire() -> None:
    tested = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing = {
        case["alertname"]
        for test in tested
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert {rule["alert"] for rule in rules()} <= firing


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """Each panel's query, Grafana's ``$__rate_interval`` given a value, checked as a
    recording rule by promtool."""
    queries = [expr.replace("$__rate_interval", "5m") for expr in dashboard_expressions()]
    recording = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query{index}", "expr": expr}
                    for index, expr in enumerate(queries)
                ],
            }
        ]
    }
    checked = tmp_path / "dashboard-queries.yml"
    checked.write_text(yaml.safe_dump(recording))
    done = subprocess.run(
        [promtool(), "check", "rules", str(checked)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_an_expression_names_is_exported(source: str) -> None:
    expressions = (
        [rule["expr"] for rule in rules()] if source == "rules" else dashboard_expressions()
    )
    named = {name for expr in expressions for name in OUR_METRIC.findall(expr)}
    assert named, "the expressions name our metrics"
    assert named <= exported_samples(), sorted(named - exported_samples())


def test_every_exported_metric_is_in_the_reference() -> None:
    documented = set(re.findall(r"^\| `(habeat_[a-z_]+)`", REFERENCE.read_text(), re.MULTILINE))
    families = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in REGISTRY.collect()
        if family.name.startswith("habeat_")
    }
    assert families <= documented, sorted(families - documented)


def test_the_compose_prometheus_is_valid_and_scrapes_services_that_serve_metrics() -> None:
    config = ROOT / "deploy" / "prometheus" / "prometheus.yml"
    done = subprocess.run(
        [promtool(), "check", "config", str(config)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    scraped = yaml.safe_load(config.read_text())["scrape_configs"]
    targets = [target for job in scraped for c in job["static_configs"] for target in c["targets"]]
    for target in targets:
        host, port = target.split(":")
        environment = services[host]["environment"]
        served = {
            environment.get("HABEAT_METRICS_PORT"),
            environment.get("HABEAT_WORKER_METRICS_PORT"),
        }
        assert port in served, (target, environment)
        assert environment.get("HABEAT_METRICS_ADDRESS") == "0.0.0.0", target
