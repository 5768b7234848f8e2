"""HTML of the UI plugin: the pipeline list and the per-pipeline checkpoints page (Flink's
checkpoints tab: overview, history, summary, configuration, generations, pending work).

Rendered on the server from `PipelineHistory.to_json()` with Jinja2 autoescaping: every
value from the store is escaped. No script, no external resource.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from jinja2 import Environment

from airflow_sparkpoint.plugins import charts
from airflow_sparkpoint.services.history import size

__all__ = ["CONTENT_SECURITY_POLICY", "message_page", "pipeline_list", "pipeline_page"]

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px;color:#1f2933;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:15px;margin:22px 0 8px;color:#334e68}
.sub{color:#627d98;font-size:13px;margin-bottom:12px}
table{border-collapse:collapse;font-size:13px;margin-bottom:6px}
th,td{padding:4px 10px;border-bottom:1px solid #e4e7eb;text-align:left;white-space:nowrap}
th{background:#f0f4f8;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #d9e2ec;border-radius:6px;padding:8px 12px;min-width:150px}
.card .k{font-size:11px;color:#627d98;text-transform:uppercase}.card .v{font-size:16px;font-weight:600}
.card .t{font-size:11px;color:#829ab1}
.valid{color:#0b7a3e}.invalid{color:#b42318}.superseded{color:#9a6700}.muted{color:#829ab1}
a{color:#2563eb;text-decoration:none}a:hover{text-decoration:underline}
.trends{display:flex;flex-wrap:wrap;gap:14px}.trend{border:1px solid \
#d9e2ec;border-radius:6px;background:#fff}
.trend .axis{stroke:#bcccdc;stroke-width:1}.trend .line{fill:none;stroke:#2563eb;stroke-width:1.5}
.trend .dot{fill:#2563eb}.trend text{font-size:10px;fill:#627d98}.trend \
.ttl{font-size:11px;fill:#334e68;font-weight:600}
"""

#: the policy of every response: nothing loads but the page's own style; only Airflow's
#: pages (same origin) may frame it (the plugin's entry shows it in an iframe)
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; "
    f"style-src 'sha256-{base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()}'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'self'"
)

_BASE = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>{{ title }}</title><style>{{ style }}</style></head><body>{{ body }}</body></html>"""

_LIST = """
<h1>Sparkpoint pipelines</h1>
<div class="sub">Checkpointed Spark jobs under the storage root of each <code>sparkpoint</code> connection you
may read, and those a connection declares for DAGs you may read (extra <code>\
{"jobs": {"orders": {"dags": [...]}}}</code>).</div>
{% if rows %}
<table id="pipelines"><tr><th>connection</th><th>job</th><th>DAGs</th></tr>
{% for p in rows %}<tr><td>{{ p.conn_id }}</td><td>\
<a href="{{ base }}/pipelines/{{ p.conn_id }}/{{ p.job }}">{{ p.job }}</a></td>
<td>{{ p.dags|join(", ") or "-" }}</td></tr>{% endfor %}</table>
{% else %}<p class="muted">No pipeline to show.</p>{% endif %}
{% if dag_id %}<p class="muted">Pipelines used by DAG {{ dag_id }}.</p>{% endif %}
"""

_PAGE = """
<h1>{{ h.job }} <span class="muted">· {{ conn_id }}</span></h1>
<div class="sub">{{ h.root }} · read {{ when(h.generated_at) }}\
 · <a href="{{ base }}/pipelines">all pipelines</a>
 · <a href="{{ base }}/api/pipelines/{{ conn_id }}/{{ h.job }}">JSON</a></div>

<h2>Overview</h2>
<div class="cards" id="overview">
 <div class="card"><div class="k">state</div><div class="v">{{ h.state }}</div>
  <div class="t">{{ "alive" if h.alive else "not alive" }}\
{% if h.heartbeat_age_s is not none %}, heartbeat {{ "%.0f"|format(h.heartbeat_age_s) }} s ago{% endif %}\
</div></div>
 <div class="card"><div class="k">generation</div><div class="v">{{ h.generation }}</div>
  <div class="t">{% if h.airflow_try %}{{ h.airflow_try.dag_id }}.{{ h.airflow_try.task_id }}\
 try {{ h.airflow_try.try_number }}{% else %}not started by an Airflow task{% endif %}</div></div>
 <div class="card"><div class="k">completed</div>\
<div class="v" id="count-completed">{{ h.counts.completed }}</div>\
<div class="t">{{ "ever" if h.counts.lifetime else "retained" }}</div></div>
 <div class="card"><div class="k">failed</div><div class="v" id="count-failed">{{ h.counts.failed }}</div>\
<div class="t">{{ when(h.last_failure_at) if h.last_failure_at else "" }}</div></div>
 <div class="card"><div class="k">in progress</div><div class="v">{{ h.counts.in_progress }}</div></div>
 <div class="card"><div class="k">restored</div><div class="v">{{ h.counts.restored }}</div></div>
 <div class="card"><div class="k">latest completed</div>\
<div class="v">{% if h.latest_completed %}chk-{{ h.latest_completed.id }}{% else %}-{% endif %}</div>
  <div class="t">{% if h.latest_completed %}batch {{ h.latest_completed.batch_id }}, \
{{ when(h.latest_completed.created_at) }} ({{ "%.0f"|format(h.latest_completed_age_s) }} s ago){% endif %}\
</div></div>
 <div class="card"><div class="k">latest failed</div>\
<div class="v">{% if h.latest_failed %}chk-{{ h.latest_failed.id }}{% else %}-{% endif %}</div>
  <div class="t">{% if h.latest_failed %}{{ h.latest_failed.error }}{% endif %}</div></div>
 <div class="card"><div class="k">latest savepoint</div>\
<div class="v">{% if h.latest_savepoint %}{{ short(h.latest_savepoint.uri) }}{% else %}-{% endif %}</div>
  <div class="t">{% if h.latest_savepoint %}batch {{ h.latest_savepoint.batch_id }}, \
{{ when(h.latest_savepoint.created_at) }}{% endif %}</div></div>
 <div class="card"><div class="k">latest restore</div>\
<div class="v">{% if h.latest_restore %}gen {{ h.latest_restore.generation }}{% else %}-{% endif %}</div>
  <div class="t">{% if h.latest_restore %}from {{ h.latest_restore.origin }}, \
{{ when(h.latest_restore.started_at) }}{% endif %}</div></div>
</div>
{% if h.error %}<p class="invalid">last error: {{ h.error }}</p>{% endif %}

<h2>Trends <span class="muted">(last {{ h.trend|length }} completed checkpoints, kept across restarts)</span>\
</h2>
{% if h.trend %}<div class="trends" id="trends">{% for c in charts %}
<svg class="trend" id="trend-{{ c.key }}" data-points="{{ c.points|length }}" role="img" \
aria-labelledby="trend-{{ c.key }}-title"
 width="{{ geo.width }}" height="{{ geo.height }}" viewBox="0 0 {{ geo.width }} {{ geo.height }}" xmlns="http://www.w3.org/2000/svg">
<title id="trend-{{ c.key }}-title">{{ c.title }}: last {{ c.last_label }}, max {{ c.y_max_label }}</title>
<text class="ttl" x="{{ geo.left }}" y="{{ geo.top - 7 }}">{{ c.title }} · last {{ c.last_label }}</text>
<line class="axis" x1="{{ geo.left }}" y1="{{ geo.top }}" x2="{{ geo.left }}" y2="{{ geo.bottom }}"/>
<line class="axis" x1="{{ geo.left }}" y1="{{ geo.bottom }}" x2="{{ geo.right }}" y2="{{ geo.bottom }}"/>
<text x="{{ geo.left - 4 }}" y="{{ geo.top + 10 }}" text-anchor="end">{{ c.y_max_label }}</text>
<text x="{{ geo.left - 4 }}" y="{{ geo.bottom }}" text-anchor="end">{{ c.y_min_label }}</text>
<text x="{{ geo.left }}" y="{{ geo.height - 6 }}">{{ c.x_first_label }}</text>
<text x="{{ geo.right }}" y="{{ geo.height - 6 }}" text-anchor="end">{{ c.x_last_label }}</text>
{% if c.points|length > 1 %}<polyline class="line" points="{{ c.polyline }}"/>{% endif %}
{% if c.points|length <= 60 %}{% for x, y in c.points %}\
<circle class="dot" cx="{{ "%.1f"|format(x) }}" cy="{{ "%.1f"|format(y) }}" r="2"/>{% endfor %}{% endif %}
</svg>{% endfor %}</div>
{% else %}<p class="muted">no completed checkpoint recorded yet (the trend starts with this release's \
runtime)</p>{% endif %}

<h2>History</h2>
<table id="history"><tr><th>kind</th><th>id</th><th>status</th><th>batch</th><th>gen</th>\
<th>completed (UTC)</th>
<th>duration</th><th>copied</th><th>total</th><th>files</th><th>partitions</th><th>drill</th></tr>
{% for r in h.checkpoints + h.savepoints %}
<tr class="snapshot" data-kind="{{ r.kind }}" data-id="{{ r.id }}" data-status="{{ r.status }}">
<td>{{ r.kind }}</td><td class="num">{{ r.id }}</td>
<td class="{{ r.status }}">{{ r.status }}{% if r.superseded_by %} by gen {{ r.superseded_by }}{% endif %}\
{% if r.error %}: {{ r.error }}{% endif %}</td>
<td class="num">{{ dash(r.batch_id) }}</td><td class="num">{{ dash(r.generation) }}</td>\
<td>{{ dash(r.created) }}</td>
<td class="num">{{ ms(r.duration_ms) }}</td><td class="num">{{ size(r.bytes_copied) }}</td>\
<td class="num">{{ size(r.bytes_total) }}</td>
<td class="num">{{ dash(r.file_count) }}</td><td class="num">{{ dash(r.state_partitions) }}</td>
<td>{% if r.verified_at %}{{ "FAILED: " ~ r.verify_error if r.verify_error else "ok" }}\
 {{ when(r.verified_at) }}{% else %}<span class="muted">never</span>{% endif %}</td></tr>
{% else %}<tr><td colspan="12" class="muted">no retained checkpoint or savepoint</td></tr>{% endfor %}
</table>

<h2>Summary <span class="muted">(retained completed checkpoints)</span></h2>
<table id="summary"><tr><th></th><th>min</th><th>avg</th><th>max</th></tr>
{% for label, key, fmt in [("duration", "duration_ms", ms), ("bytes copied", "bytes_copied", size), \
("total size", "bytes_total", size)] %}
<tr><td>{{ label }}</td>{% set s = h.summary[key] %}{% for part in ["min", "avg", "max"] %}\
<td class="num">{{ fmt(s[part]) if s else "-" }}</td>{% endfor %}</tr>
{% endfor %}</table>

<h2>Configuration in force</h2>
{% if h.config %}<table id="config">{% for k, v in h.config.items() %}<tr><th>spark.sparkpoint.{{ k }}</th>\
<td>{{ v }}</td></tr>{% endfor %}</table>
{% else %}<p class="muted">not recorded by the running generation</p>{% endif %}

<h2>Generations and Airflow tries</h2>
<table id="generations"><tr><th>gen</th><th>started (UTC)</th><th>Airflow task try</th><th>restored from</th>\
<th>outcome</th><th>batches</th><th>host</th></tr>
{% for g in h.generations %}<tr><td class="num">{{ g.generation }}</td><td>{{ dash(g.started) }}</td>
<td>{% if g.airflow %}{{ g.airflow.dag_id }}.{{ g.airflow.task_id }} try {{ g.airflow.try_number }}\
 <span class="muted">{{ g.airflow.run_id }}</span>{% else %}<span class="muted">-</span>{% endif %}</td>
<td>{{ g.origin }}</td><td>{{ g.outcome }}{% if g.error %}: {{ g.error }}{% endif %}</td>
<td>{% if g.first_batch is not none %}{{ g.first_batch }}..{{ g.last_batch }}{% else %}-{% endif %}</td>\
<td>{{ g.host }}</td></tr>
{% else %}<tr><td colspan="7" class="muted">the job never started</td></tr>{% endfor %}</table>

<h2>Pending control requests</h2>
{% if h.requests %}<table id="requests"><tr><th>id</th><th>kind</th><th>state</th><th>generation</th>\
<th>requested</th><th>by</th></tr>
{% for r in h.requests %}<tr><td>{{ r.id }}</td><td>{{ r.kind }}</td><td>{{ r.state }}</td>\
<td>{{ dash(r.generation) }}</td><td>{{ r.created }}</td><td>{{ r.requested_by }}</td>\
</tr>{% endfor %}</table>
{% else %}<p class="muted">none</p>{% endif %}

<h2>Zero-downtime cutovers <span class="muted">(newest first)</span></h2>
{% if h.cutovers %}<table id="cutovers"><tr><th>id</th><th>state</th><th>blue gen</th>\
<th>warm-up from</th><th>green replayed</th><th>after batch N</th><th>green gen</th><th>planned</th>\
<th>ended</th><th>reason</th><th>blue's final savepoint</th></tr>
{% for c in h.cutovers %}<tr><td>{{ c.id }}</td><td class="state-{{ c.step }}">{{ c.step }}\
{% if c.step in ("planned", "agreed") %} (open){% elif c.step == "aborted" %} (called off){% endif %}</td>\
<td class="num">{{ c.blue_generation }}</td><td class="num">{{ c.warmup_batch }}</td>\
<td class="num">{{ dash(c.green_replayed_batch) }}</td><td class="num">{{ dash(c.after_batch) }}</td>\
<td class="num">{{ dash(c.green_generation) }}</td><td>{{ when(c.created_at) }}</td>\
<td>{{ when(c.ended_at) }}{% if c.rolled_back_at %}, rolled back {{ when(c.rolled_back_at) }}\
{% if c.rolled_back_to %} to {{ c.rolled_back_to }}{% endif %}{% endif %}</td>\
<td>{{ c.reason or "" }}</td><td>{{ c.blue_savepoint or "" }}</td></tr>{% endfor %}</table>
{% else %}<p class="muted">none</p>{% endif %}

<h2>Staged transactions not yet promoted</h2>
{% if h.staged %}<table id="staged"><tr><th>transaction</th><th>batch</th><th>generation</th><th>sink</th>\
<th>staged</th></tr>
{% for t in h.staged %}<tr><td>{{ t.txn_id }}</td><td class="num">{{ t.batch_id }}</td>\
<td class="num">{{ t.generation }}</td><td>{{ t.sink_id }}</td><td>{{ dash(t.created) }}</td>\
</tr>{% endfor %}</table>
{% else %}<p class="muted">none</p>{% endif %}
"""

_MESSAGE = """<h1>{{ heading }}</h1><p>{{ message }}</p><p><a href="{{ base }}/pipelines">all pipelines</a>\
</p>"""

_env = Environment(autoescape=True)


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _size(n: float | None) -> str:
    return size(n)


def _ms(n: float | None) -> str:
    return "-" if n is None else f"{n:.0f} ms"


_HELPERS = {
    "when": _when, "size": _size, "ms": _ms, "dash": lambda v: "-" if v is None else v,
    "short": lambda uri: str(uri).rstrip("/").rsplit("/", 1)[-1],
}


def _document(title: str, template: str, **values: Any) -> str:
    body = _env.from_string(template).render(**_HELPERS, **values)
    from markupsafe import Markup

    return _env.from_string(_BASE).render(title=title, style=Markup(_STYLE), body=Markup(body))


_GEOMETRY = {"width": charts.WIDTH, "height": charts.HEIGHT, "left": charts.LEFT,
             "right": charts.WIDTH - charts.RIGHT, "top": charts.TOP, "bottom": charts.HEIGHT - charts.BOTTOM}


def pipeline_page(history: Mapping[str, Any], conn_id: str, base: str) -> str:
    """The checkpoints page of one pipeline (`history`: `PipelineHistory.to_json()`)."""
    trend_charts = charts.charts(history.get("trend") or [], {"duration_ms": _ms, "bytes_copied": _size,
                                                              "bytes_total": _size}, _when)
    return _document(f"{history['job']} · Sparkpoint checkpoints", _PAGE, h=history, conn_id=conn_id,
                     base=base, charts=trend_charts, geo=_GEOMETRY)


def pipeline_list(rows: Sequence[Mapping[str, Any]], base: str, dag_id: str | None = None) -> str:
    """The list of pipelines (`rows`: conn_id, job, dags)."""
    return _document("Sparkpoint pipelines", _LIST, rows=rows, base=base, dag_id=dag_id)


def message_page(heading: str, message: str, base: str) -> str:
    return _document(heading, _MESSAGE, heading=heading, message=message, base=base)
