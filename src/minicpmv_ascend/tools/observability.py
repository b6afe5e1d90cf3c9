"""The operator's view of the service, deploy/observability: Prometheus rules (rules.yaml, with their
unit tests rules.test.yaml), a Grafana dashboard (dashboard.json) and the compose users' scrape
config (prometheus.yaml); for Kubernetes, the ServiceMonitor component carries the same rules as a
PrometheusRule made from rules.yaml here (`make docs`, or `python -m
minicpmv_ascend.tools.observability --write`).

Declared here: METRICS, every metric the rules and the dashboard read, with the vLLM releases that
export it (the Ascend targets' 0.23.0 and 0.30.0, the CPU stack's 0.32.0). `problems_on(...)` checks
that claim against an installed vLLM's own files (plugin/tests in each target's venv, tests/ in
.venv), tests/test_observability.py that the rules and the dashboard read nothing else. The tables
of docs/observability.md are made from rules.yaml, dashboard.json and METRICS (scripts/doc_tables.py),
so the thresholds, the rows and the release columns are written once.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import pathlib
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import yaml

REPO = pathlib.Path(__file__).resolve().parents[3]  # src/minicpmv_ascend/tools/observability.py
HERE = REPO / "deploy" / "observability"
RULES = HERE / "rules.yaml"
RULES_TEST = HERE / "rules.test.yaml"
DASHBOARD = HERE / "dashboard.json"
SCRAPE_CONFIG = HERE / "prometheus.yaml"
PROMETHEUS_RULE = REPO / "deploy" / "k8s" / "components" / "servicemonitor" / "prometheusrule.yaml"
JOB = "minicpmv-ascend"  # the scrape job the rules select (compose's job_name; the ServiceMonitor's jobLabel)

RELEASES = ("0.23.0", "0.30.0", "0.32.0")  # vLLM of the Ascend targets v0.23.0 and v0.30.0, and the CPU stack
ALL = RELEASES

# Where a metric comes from, and how an installed vLLM's files show it is there (problems_on).
VLLM = "vllm"  # vLLM's engine metrics: a `"vllm:<name>"` literal in vllm/v1/metrics/*.py
HTTP = "http"  # prometheus-fastapi-instrumentator, which vLLM's API server installs on its app
PROCESS = "process"  # prometheus_client's process collector (default registry: one API server)
SCRAPE = "scrape"  # written by Prometheus itself for every target
NPU_EXPORTER = "npu-exporter"  # MindCluster's NPU Exporter on the NPU host; read from its docs, not run here
NPU_EXPORTER_DOCS = ("https://www.hiascend.com/document/detail/en/mindcluster/730/clustersched/schedulingug/"
                     "dlug_api_004.html")


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str  # the family as its exporter declares it (a counter without `_total`, a histogram without `_bucket`)
    kind: str  # "counter", "gauge" or "histogram"
    source: str  # VLLM, HTTP, PROCESS, SCRAPE or NPU_EXPORTER
    releases: tuple[str, ...]  # the vLLM releases that export it (RELEASES; () for the NPU exporter's)
    meaning: str

    def series_names(self) -> tuple[str, ...]:
        """The names a query uses: counter `_total`, histogram `_bucket` / `_sum` / `_count`."""
        if self.kind == "counter":
            return (f"{self.name}_total",)
        if self.kind == "histogram":
            return tuple(f"{self.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
        return (self.name,)


METRICS: tuple[Metric, ...] = (
    Metric("up", "gauge", SCRAPE, ALL, "1 when Prometheus' last scrape of the target succeeded, else 0"),
    Metric("process_start_time_seconds", "gauge", PROCESS, ALL,
           "when the API server's process started (absent with `--api-server-count` > 1: vLLM then serves a "
           "multiprocess registry without the process collector)"),
    Metric("http_requests", "counter", HTTP, ALL,
           "HTTP answers by `handler`, `method`, `status` (2xx/4xx/5xx), counted inside the kit's middleware "
           "(\"What the rules see\")"),
    Metric("vllm:request_success", "counter", VLLM, ALL,
           "requests the engine finished, by `finished_reason` (stop, length, abort, error, repetition)"),
    Metric("vllm:time_to_first_token_seconds", "histogram", VLLM, ALL, "time to first token"),
    Metric("vllm:e2e_request_latency_seconds", "histogram", VLLM, ALL, "arrival to last token"),
    Metric("vllm:request_queue_time_seconds", "histogram", VLLM, ALL, "time waiting in the queue"),
    Metric("vllm:request_time_per_output_token_seconds", "histogram", VLLM, ALL, "time per output token, per request"),
    Metric("vllm:num_requests_running", "gauge", VLLM, ALL, "requests in the running batch"),
    Metric("vllm:num_requests_waiting", "gauge", VLLM, ALL, "requests in the queue"),
    Metric("vllm:num_requests_waiting_by_reason", "gauge", VLLM, ALL, "the queue by `reason` (capacity, deferred)"),
    Metric("vllm:kv_cache_usage_perc", "gauge", VLLM, ALL, "KV cache blocks in use, 0 to 1"),
    Metric("vllm:num_preemptions", "counter", VLLM, ALL, "requests preempted (their KV freed, recomputed later)"),
    Metric("vllm:admission_rejections", "counter", VLLM, ("0.32.0",),
           "requests refused by a queue limit (`--max-num-queued-reqs`), by `reason`"),
    Metric("vllm:prompt_tokens", "counter", VLLM, ALL, "prompt tokens processed"),
    Metric("vllm:generation_tokens", "counter", VLLM, ALL, "tokens generated"),
    Metric("vllm:prefix_cache_queries", "counter", VLLM, ALL, "tokens looked up in the prefix cache"),
    Metric("vllm:prefix_cache_hits", "counter", VLLM, ALL, "of those, found"),
    Metric("vllm:mm_cache_queries", "counter", VLLM, ALL, "multimodal items looked up in the processor cache"),
    Metric("vllm:mm_cache_hits", "counter", VLLM, ALL, "of those, found"),
    Metric("vllm:request_prompt_tokens", "histogram", VLLM, ALL, "prompt tokens per request"),
    Metric("vllm:request_generation_tokens", "histogram", VLLM, ALL, "generated tokens per request"),
    Metric("npu_chip_info_hbm_used_memory", "gauge", NPU_EXPORTER, (), "HBM in use per NPU, MB"),
    Metric("npu_chip_info_hbm_total_memory", "gauge", NPU_EXPORTER, (), "HBM per NPU, MB"),
    Metric("npu_chip_info_utilization", "gauge", NPU_EXPORTER, (), "AI Core use per NPU, %"),
    Metric("npu_chip_info_health_status", "gauge", NPU_EXPORTER, (), "1 healthy, 0 not"),
)

# The label values the rules select on, as each vLLM release's code spells them: (file under the
# installed packages, what it must contain, why).
LABEL_FACTS: tuple[tuple[str, str, str], ...] = (
    ("vllm/v1/engine/__init__.py", '"error"', 'finished_reason="error" (FinishReason.ERROR)'),
    ("prometheus_fastapi_instrumentator/instrumentation.py", "should_group_status_codes: bool = True",
     'status="5xx" (the instrumentator groups statuses by default)'),
    ("vllm/entrypoints/serve/instrumentator/metrics.py", "Instrumentator(",
     "vLLM's API server installs prometheus-fastapi-instrumentator"),
)

# Dashboard variables and the values the live test gives them (tests/test_observability.py).
DASHBOARD_VARIABLES = {"datasource": None, "job": JOB, "instance": ".*", "npu_job": "npu-exporter"}

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NAME = re.compile(r"(?<![\w:.$])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:])(?!\s*\()")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "inf", "nan", "atan2"}
_GROUPING_LABELS = re.compile(r"\b(?:by|without)\s*\(([^()]*)\)")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (label matchers, ranges, grouping clauses, strings,
    functions and keywords left out)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    return {name for name in _NAME.findall(text) if name.lower() not in _KEYWORDS}


def grouping_labels(expr: str) -> set[str]:
    """The labels of the expression's `by (...)` clauses."""
    return {label.strip() for group in _GROUPING_LABELS.findall(expr) for label in group.split(",") if label.strip()}


def duration_seconds(duration: str) -> float:
    """A Prometheus or compose duration ("30m", "1h", "90s", "1m30s") in seconds."""
    parts = re.findall(r"(\d+)(ms|s|m|h|d)", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a duration: {duration!r}")
    unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(int(n) * unit[u] for n, u in parts)


def alert(name: str) -> dict[str, Any]:
    """The alert rule `name` of rules.yaml."""
    found = [rule for rule in rules("alert") if rule["alert"] == name]
    if len(found) != 1:
        raise KeyError(f"rules.yaml has {len(found)} alerts named {name!r}")
    return found[0]


def load_rules(path: pathlib.Path = RULES) -> dict[str, Any]:
    return copy.deepcopy(_parsed(path, path.stat().st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _parsed(path: pathlib.Path, mtime_ns: int) -> dict[str, Any]:
    """A YAML file parsed once per version (PyYAML's pure-Python parser takes ~0.2 s for rules.yaml)."""
    return yaml.safe_load(path.read_text())


def rules(kind: str, path: pathlib.Path = RULES) -> list[dict[str, Any]]:
    """The rules of rules.yaml that are `kind` ("alert" or "record"), in file order."""
    return [rule for group in load_rules(path)["groups"] for rule in group["rules"] if kind in rule]


def load_dashboard(path: pathlib.Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(path.read_text())


@dataclasses.dataclass(frozen=True)
class Query:
    row: str
    panel: str
    expr: str
    legend: str


def dashboard_queries(dashboard: dict[str, Any] | None = None) -> list[Query]:
    """Every query of every panel, with the row it sits in (a row panel starts a row; the panels
    after it, until the next, are its own)."""
    dashboard = dashboard if dashboard is not None else load_dashboard()
    queries, row = [], ""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            continue
        for target in panel.get("targets", []):
            queries.append(Query(row, panel["title"], target["expr"], target.get("legendFormat", "")))
    return queries


def with_variables(expr: str, values: dict[str, str], rate_interval: str) -> str:
    """A dashboard query as Grafana sends it, with the variables' values (and `$__rate_interval`)."""
    text = expr.replace("$__rate_interval", rate_interval)
    for name, value in values.items():
        if value is not None:
            text = text.replace(f"${{{name}}}", value).replace(f"${name}", value)
    if "$" in text:
        raise ValueError(f"an unknown variable in {expr!r}: {text!r}")
    return text


def metric_for(series: str) -> Metric | None:
    """The declared metric a series name belongs to (None: not declared)."""
    for metric in METRICS:
        if series in metric.series_names():
            return metric
    return None


def recorded_names() -> set[str]:
    return {rule["record"] for rule in rules("record")}


def exprs_of_rules() -> dict[str, str]:
    """Every rule's name (alert or record) -> its expression."""
    return {rule.get("alert") or rule["record"]: rule["expr"] for kind in ("record", "alert") for rule in rules(kind)}


def undeclared(exprs: Iterable[str]) -> set[str]:
    """Metric names the expressions read that neither METRICS nor a recording rule declares."""
    known = recorded_names() | {name for metric in METRICS for name in metric.series_names()} | {"ALERTS"}
    return {name for expr in exprs for name in metric_names(expr)} - known


def problems_on(release: str, site_packages: pathlib.Path) -> list[str]:
    """Where METRICS and LABEL_FACTS are wrong about the vLLM `release` installed in
    `site_packages` (its own files, nothing imported): a metric said to be there that its code does
    not declare, or one said to be absent that it declares."""
    if release not in RELEASES:
        raise ValueError(f"vLLM {release} is not one of the releases METRICS describes: {', '.join(RELEASES)}")
    found = []
    engine_code = "\n".join(p.read_text(errors="replace") for p in sorted((site_packages / "vllm/v1/metrics").glob("*.py")))
    if not engine_code:
        return [f"no vllm/v1/metrics/*.py under {site_packages}"]
    checks = {
        HTTP: (site_packages / "prometheus_fastapi_instrumentator/metrics.py", '"http_requests_total"'),
        PROCESS: (site_packages / "prometheus_client/process_collector.py", "'start_time_seconds'"),
    }
    for metric in METRICS:
        if metric.source in (SCRAPE, NPU_EXPORTER):
            continue
        if metric.source == VLLM:
            present = f'"{metric.name}"' in engine_code
            where = "vllm/v1/metrics/*.py"
        else:
            path, needle = checks[metric.source]
            present = path.is_file() and needle in path.read_text(errors="replace")
            where = str(path.relative_to(site_packages))
        claimed = release in metric.releases
        if present != claimed:
            found.append(f"{metric.name}: METRICS says vLLM {release} {'has' if claimed else 'lacks'} it, "
                         f"{where} {'declares' if present else 'does not declare'} it")
    for name, needle, why in LABEL_FACTS:
        path = site_packages / name
        if not (path.is_file() and needle in path.read_text(errors="replace")):
            found.append(f"{name} has no {needle!r}: {why}")
    return found


# ------------------------------------------------------------------ generated files and tables

PROMETHEUS_RULE_HEADER = """\
# Generated from deploy/observability/rules.yaml by `make docs` (python -m
# minicpmv_ascend.tools.observability --write): edit that file, not this one. The Prometheus
# Operator loads it like the ServiceMonitor beside it; kube-prometheus-stack selects PrometheusRules by
# label too (`release: <its release name>` by default): add that label here if it does not pick it up.
"""


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the expressions) as YAML block literals, as rules.yaml writes them."""


_BlockDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def prometheus_rule() -> str:
    """deploy/k8s/components/servicemonitor/prometheusrule.yaml: rules.yaml's groups as a PrometheusRule."""
    document = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "minicpmv", "labels": {"app.kubernetes.io/name": JOB}},
        "spec": {"groups": load_rules()["groups"]},
    }
    return PROMETHEUS_RULE_HEADER + yaml.dump(document, Dumper=_BlockDumper, sort_keys=False, width=100, allow_unicode=True)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _duration(rule: dict[str, Any]) -> str:
    return rule.get("for", "0s")


def alerts_markdown() -> str:
    """docs/observability.md's table of the alerts, from rules.yaml."""
    lines = ["| alert | fires when (PromQL, from rules.yaml) | for | severity | runbook |", "|---|---|---|---|---|"]
    for rule in rules("alert"):
        lines.append(f"| `{rule['alert']}` | `{_cell(rule['expr'])}` | {_duration(rule)} | "
                     f"{rule['labels']['severity']} | {_cell(rule['annotations']['runbook'])} |")
    records = ", ".join(f"`{rule['record']}`" for rule in rules("record"))
    lines += ["", f"Recording rules (their expressions: rules.yaml): {records}."]
    return "\n".join(lines) + "\n"


def rows_markdown() -> str:
    """docs/observability.md's table of the dashboard's rows and their panels, from dashboard.json."""
    rows: dict[str, list[str]] = {}
    for panel in load_dashboard()["panels"]:
        if panel["type"] == "row":
            rows[panel["title"]] = []
        else:
            rows[list(rows)[-1]].append(panel["title"])
    lines = ["| row (the question) | panels |", "|---|---|"]
    lines += [f"| {_cell(row)} | {_cell('; '.join(panels))} |" for row, panels in rows.items()]
    return "\n".join(lines) + "\n"


def metrics_markdown() -> str:
    """docs/observability.md's table of the metrics read, with the releases that export them."""
    sources = {VLLM: "vLLM", HTTP: "vLLM's HTTP layer", PROCESS: "API server process", SCRAPE: "Prometheus",
               NPU_EXPORTER: "NPU Exporter (not run here)"}
    lines = [f"| metric | from | what it is (vLLM {', '.join(RELEASES)} export each vLLM metric unless it says) |",
             "|---|---|---|"]
    for metric in METRICS:
        names = ", ".join(f"`{n}`" for n in metric.series_names()) if metric.kind != "histogram" \
            else f"`{metric.name}_bucket` (`_sum`, `_count`)"
        missing = [r for r in RELEASES if r not in metric.releases] if metric.source != NPU_EXPORTER else []
        absent = f"; **not in vLLM {', '.join(missing)}**" if missing else ""
        lines.append(f"| {names} | {sources[metric.source]} | {_cell(metric.meaning)}{absent} |")
    return "\n".join(lines) + "\n"


def write(check: bool = False) -> list[str]:
    """Write the generated PrometheusRule (`check`: write nothing); the files that changed (or would)."""
    text = prometheus_rule()
    if PROMETHEUS_RULE.is_file() and PROMETHEUS_RULE.read_text() == text:
        return []
    if not check:
        PROMETHEUS_RULE.write_text(text)
    return [str(PROMETHEUS_RULE.relative_to(REPO))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minicpmv_ascend.tools.observability",
                                     description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write the PrometheusRule made from rules.yaml")
    mode.add_argument("--check", action="store_true", help="exit 1 if the PrometheusRule is out of date")
    mode.add_argument("--problems", metavar="SITE_PACKAGES",
                      help="check METRICS against the vLLM installed there (its version read from its metadata)")
    args = parser.parse_args(argv)
    if args.problems:
        site = pathlib.Path(args.problems)
        dists = sorted(site.glob("vllm*.dist-info/METADATA"))
        version = next((line.split(":", 1)[1].strip() for d in dists for line in d.read_text().splitlines()
                        if line.startswith("Version:")), None)
        if version is None:
            parser.error(f"no vLLM distribution in {site}")
        found = problems_on(version.split("+")[0], site)
        print("\n".join(found) or f"METRICS holds for vLLM {version}")
        return 1 if found else 0
    changed = write(check=args.check)
    if changed:
        print(("rewrote: " if args.write else "out of date (run `make docs`): ") + ", ".join(changed),
              file=sys.stdout if args.write else sys.stderr)
        return 0 if args.write else 1
    print(f"up to date: {PROMETHEUS_RULE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
