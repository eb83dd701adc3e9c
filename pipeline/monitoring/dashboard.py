"""The Grafana dashboard of a served LPX model, built as data with grafana-foundation-sdk: the same panels for
every target, reading promql.py's vocabulary and recorded series (rules.py must be installed for those).
Variables: the Prometheus data source, namespace and pod. PANELS lists the rows and panels (the README
shows it); `dashboard()` builds them.
"""

from __future__ import annotations

import json
from typing import Any

from ..deploy.k8s import QUEUE_RATIO
from . import promql as q

UID = "lpx-serving"
TITLE = "LPX serving"
SEL = 'namespace=~"$namespace", pod=~"$pod"'  # every query's selector


def _sel(family: str, extra: str = "") -> str:
    return f"{family}{{{SEL}{', ' + extra if extra else ''}}}"


def _quantiles(family: str) -> list[tuple[str, str]]:
    return [
        (
            f"histogram_quantile({p}, sum by (pod, le) (rate({_sel(family + '_bucket')}[$__rate_interval])))",
            f"p{int(p * 100)} {{{{pod}}}}",
        )
        for p in (0.5, 0.99)
    ]


ITERATIONS = _sel(q.GENERAL, 'general_type="iteration_counter"')
# (row, [(title, unit, [(PromQL, legend), ...]), ...]); units are Grafana's unit ids
PANELS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]]]]]] = [
    (
        "Traffic",
        [
            ("Requests / s", "reqps", [(_sel(q.REQUEST_RATE), "{{pod}}")]),
            ("Refused requests", "percentunit", [(_sel(q.ERROR_RATIO), "{{pod}}")]),
            (
                "Requests in flight and waiting",
                "short",
                [(_sel(q.SCHEDULED), "in batch {{pod}}"), (_sel(q.WAITING), "waiting {{pod}}")],
            ),
            (
                "Tokens / s",
                "short",
                [(_sel(q.INPUT_TOKEN_RATE), "input {{pod}}"), (_sel(q.OUTPUT_TOKEN_RATE), "output {{pod}}")],
            ),
        ],
    ),
    (
        "Latency (gateway)",
        [
            ("Time to first token", "s", _quantiles(q.GATEWAY_TTFT)),
            ("Inter-token latency", "s", _quantiles(q.GATEWAY_ITL)),
            ("End to end", "s", _quantiles(q.GATEWAY_E2E)),
            ("Queue / compute time", "short", [(_sel(QUEUE_RATIO), "{{pod}}")]),
        ],
    ),
    (
        "Engine",
        [
            (
                "Batch",
                "short",
                [
                    (_sel(q.REQUESTS, 'request_type="scheduled"'), "scheduled {{pod}}"),
                    (_sel(q.REQUESTS, 'request_type="context"'), "in prompt {{pod}}"),
                    (
                        _sel(q.BATCHER, 'inflight_batcher_specific_metric="generation_requests"'),
                        "generating {{pod}}",
                    ),
                ],
            ),
            ("KV cache used", "percentunit", [(_sel(q.KV_USED), "{{pod}}")]),
            (
                "KV-cache blocks",
                "short",
                [
                    (_sel(q.KV_BLOCKS, 'kv_cache_block_type="used"'), "used {{pod}}"),
                    (_sel(q.KV_BLOCKS, 'kv_cache_block_type="max"'), "all {{pod}}"),
                ],
            ),
            (
                "Engine iterations / s",
                "short",
                [(f"rate({ITERATIONS}[$__rate_interval])", "{{pod}}")],
            ),
        ],
    ),
    (
        "GPU",
        [
            ("GPU utilization", "percentunit", [(_sel(q.GPU_UTILIZATION), "{{pod}} {{gpu_uuid}}")]),
            ("GPU memory used", "percentunit", [(_sel(q.GPU_MEMORY_RATIO), "{{pod}}")]),
            ("GPU power", "watt", [(_sel(q.GPU_POWER), "{{pod}} {{gpu_uuid}}")]),
            (
                "Engine memory",
                "bytes",
                [(_sel(q.MEMORY), "{{memory_type}} {{pod}}")],
            ),
        ],
    ),
]


def dashboard() -> Any:
    """The dashboard's builder (grafana_foundation_sdk.builders.dashboard.Dashboard)."""
    from grafana_foundation_sdk.builders import dashboard as gd
    from grafana_foundation_sdk.builders import prometheus, timeseries
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    source = DataSourceRef(type_val="prometheus", uid="${datasource}")
    board = (
        gd.Dashboard(TITLE)
        .uid(UID)
        .tags(["lpx", "tensorrt-llm", "triton"])
        .refresh("30s")
        .time("now-1h", "now")
        .with_variable(gd.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(_variable("namespace", f"label_values({q.SUCCESS}, namespace)", source))
        .with_variable(_variable("pod", f'label_values({q.SUCCESS}{{namespace=~"$namespace"}}, pod)', source))
    )
    ids = iter(range(1, 1000))
    for row, panels in PANELS:
        board = board.with_row(gd.Row(row).id(next(ids)))
        for title, unit, targets in panels:
            panel = timeseries.Panel().id(next(ids)).title(title).unit(unit).datasource(source)
            panel = panel.height(8).span(6)
            for ref, (expr, legend) in zip("ABCDEFGH", targets, strict=False):
                panel = panel.with_target(prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref))
            board = board.with_panel(panel)
    return board


def _variable(name: str, query: str, source: Any) -> Any:
    from grafana_foundation_sdk.builders import dashboard as gd
    from grafana_foundation_sdk.models.dashboard import VariableRefresh

    return (
        gd.QueryVariable(name)
        .label(name)
        .query(query)
        .datasource(source)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


def dashboard_json() -> str:
    """The dashboard model as Grafana imports it."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    return json.dumps(json.loads(JSONEncoder(sort_keys=True).encode(dashboard().build())), indent=2) + "\n"


def queries() -> list[str]:
    """Every PromQL expression of the dashboard's panels."""
    return [expr for _, panels in PANELS for _, _, targets in panels for expr, _ in targets]
