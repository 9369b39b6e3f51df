"""Jinja2 templates of the heuristics report: Markdown (for the repository) and self-contained HTML.

Both render the same context, built by ``miners.report``; neither reads the clock, so the same
context gives the same text.
"""

from __future__ import annotations

__all__ = ["MARKDOWN", "HTML"]

_MD_RULE = """\
{% macro rule_md(r) %}
### {{ r.id }}: {{ r.condition | md }} → {{ r.family }}

- **Remedy**: {{ r.family }}{% if r.cause %} (cause: {{ r.cause }}){% endif %}{% if r.params %}; params: `{{ r.params }}`{% endif %}

- **Support**: {{ r.support }} case{{ "s" if r.support != 1 }}; **wins** {{ r.wins }}/{{ r.support }} ({{ r.win_rate }}), **fixed** {{ r.fixed }}/{{ r.support }} (the agent now works)
- **Effect**: {{ r.effect }} ({{ r.level }} CI) on {{ r.scale | md }}
- **q-value**: {{ r.q }} (p = {{ r.p }}); evidence as of {{ r.mined_on }}, bootstrap seed {{ r.seed }}
{% if r.flag %}
- **Flag**: {{ r.flag | md }}
{% endif %}
- **Supporting cases** ({{ r.supporting | length }}): {% for c in r.supporting %}[{{ c.id }}](#{{ c.anchor }}) {{ c.effect }}{% if not loop.last %}, {% endif %}{% else %}none{% endfor %}

{% if r.counter %}
- **Counter-evidence** ({{ r.counter | length }} case{{ "s" if r.counter | length != 1 }} where it did not help or hurt):

  | case | scenario | env | status | effect |
  | --- | --- | --- | --- | --- |
{% for c in r.counter %}
  | [{{ c.id }}](#{{ c.anchor }}) | {{ c.scenario | md }} | {{ c.env | md }} | {{ c.status }} | {{ c.effect }} |
{% endfor %}
{% else %}
- **Counter-evidence**: none
{% endif %}
{% if r.reviews %}
- **Reviews**:
{% for v in r.reviews %}
  - {{ v.decision }} by {{ v.reviewer | md }} on {{ v.on }}{% if v.note %}: "{{ v.note | md }}"{% endif %}

{% endfor %}
{% else %}
- **Reviews**: none yet
{% endif %}

{% endmacro %}
"""

MARKDOWN = (
    _MD_RULE
    + """\
# Remedy heuristics report, {{ date }}

Rules mined from verified diagnose-fix-verify cases. A rule reads "when a failure looks like
the condition, patches of the remedy family helped"; its effect is pooled over the cases it
matches, with a bootstrap confidence interval, and its q-value is Benjamini–Hochberg adjusted
over the rules tested. Only accepted rules reach a diagnosis.

## Summary

| | |
| --- | --- |
| date | {{ date }} |
| KB | {{ kb | md }} |
| verified cases in the KB | {{ verified_cases }} |
{% if stopped_early %}| candidates stopped early in a race (no verdict) | {{ stopped_early }} |
{% endif %}| accepted | {{ n.accepted }} |
| awaiting review (proposed) | {{ n.proposed }} |
| rejected | {{ n.rejected }} |
| flagged (accepted, evidence turned) | {{ n.flagged }} |

{% if not n.total %}
**Nothing mined yet**: this KB holds no rules (`remedy mine` has not run on it, or no candidate passed its false-discovery threshold). {{ how_to_mine }}

{% endif %}
{% if forest %}
![Forest plot of rule effects]({{ forest.file }})

{% endif %}
## Accepted rules

{% for r in accepted %}{{ rule_md(r) }}{% else %}
None.{% if n.flagged %} ({{ n.flagged }} accepted rules are flagged: see below.){% endif %}


{% endfor %}
## Rules awaiting review

{% for r in proposed %}{{ rule_md(r) }}{% else %}
None.


{% endfor %}
## Flagged rules

Accepted rules whose evidence turned against them when the KB was re-mined; review them again.

{% for r in flagged %}{{ rule_md(r) }}{% else %}
None.


{% endfor %}
## Rejected rules

<details><summary>{{ rejected | length }} rejected rules (kept with their notes so re-mining does not propose them again)</summary>

{% for r in rejected %}{{ rule_md(r) }}{% else %}
None.

{% endfor %}
</details>

## Example cases

{% for e in examples %}
### {{ e.case.id }} ({{ e.role }} of {{ e.rule }})

![before/after of {{ e.case.id }}]({{ e.file }})

{% else %}
None: no rule cites a case with a measured effect.

{% endfor %}
## Cases

Every case a rule above cites.

{% for c in cases %}
<a id="{{ c.anchor }}"></a>
### {{ c.id }}

{% if c.in_kb %}
- env: {{ c.env | md }}, algo: {{ c.algo | md }}, scenario: {{ c.scenario | md }}
- symptoms: {{ c.symptoms | md }}
- patch: {{ c.patch | md }}
- verification: {{ c.status }} ({{ c.stage }}, {{ c.comparison }}); effect {{ c.effect | md }}; seeds {{ c.seeds }}, budget {{ c.budget }} env steps
{% if c.per_seed %}
- per seed: {{ c.per_seed | md }}
{% endif %}
{% else %}
- not in this KB (deleted or not imported); the rule's record: {{ c.status }}, {{ c.effect | md }}
{% endif %}

{% else %}
None.
{% endfor %}
"""
)

_HTML_RULE = """\
{% macro rule_html(r) %}
<section class="rule {{ r.colour }}" id="rule-{{ r.id }}">
<h3>{{ r.id }}: {{ r.condition }} → {{ r.family }}</h3>
<dl>
<dt>Remedy</dt><dd>{{ r.family }}{% if r.cause %} (cause: {{ r.cause }}){% endif %}{% if r.params %}; params <code>{{ r.params }}</code>{% endif %}</dd>
<dt>Support</dt><dd>{{ r.support }} case{{ "s" if r.support != 1 }}; wins {{ r.wins }}/{{ r.support }} ({{ r.win_rate }}); fixed {{ r.fixed }}/{{ r.support }} (the agent now works)</dd>
<dt>Effect</dt><dd>{{ r.effect }} ({{ r.level }} CI) on {{ r.scale }}</dd>
<dt>q-value</dt><dd>{{ r.q }} (p = {{ r.p }}); evidence as of {{ r.mined_on }}, bootstrap seed {{ r.seed }}</dd>
{% if r.flag %}<dt>Flag</dt><dd class="flag">{{ r.flag }}</dd>{% endif %}
<dt>Supporting cases</dt><dd>{% for c in r.supporting %}<a href="#{{ c.anchor }}">{{ c.id }}</a> {{ c.effect }}{% if not loop.last %}, {% endif %}{% else %}none{% endfor %}</dd>
</dl>
{% if r.counter %}
<table class="counter"><caption>Counter-evidence: {{ r.counter | length }} case{{ "s" if r.counter | length != 1 }} where it did not help or hurt</caption>
<tr><th>case</th><th>scenario</th><th>env</th><th>status</th><th>effect</th></tr>
{% for c in r.counter %}
<tr><td><a href="#{{ c.anchor }}">{{ c.id }}</a></td><td>{{ c.scenario }}</td><td>{{ c.env }}</td><td class="st-{{ c.status }}">{{ c.status }}</td><td>{{ c.effect }}</td></tr>
{% endfor %}
</table>
{% else %}<p>Counter-evidence: none.</p>{% endif %}
<ul class="reviews">{% for v in r.reviews %}<li>{{ v.decision }} by {{ v.reviewer }} on {{ v.on }}{% if v.note %}: “{{ v.note }}”{% endif %}</li>{% else %}<li>no reviews yet</li>{% endfor %}</ul>
</section>
{% endmacro %}
"""

_CSS = """\
body{font:15px/1.45 system-ui,-apple-system,"DejaVu Sans",sans-serif;margin:2em auto;max-width:1100px;color:#1f2328;padding:0 1em}
h1{border-bottom:2px solid #d0d7de}h2{border-bottom:1px solid #d0d7de;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0}th,td{border:1px solid #d0d7de;padding:.25em .6em;text-align:left}
th{background:#f6f8fa}caption{text-align:left;font-weight:600;padding:.2em 0}
section.rule{border-left:5px solid #0969da;padding:.2em 1em;margin:1em 0;background:#f6f8fa}
section.accepted{border-color:#1a7f37}section.flagged{border-color:#cf222e}section.rejected{border-color:#6e7781}
dl{display:grid;grid-template-columns:10em 1fr;gap:.15em 1em}dt{font-weight:600}dd{margin:0}
.flag{color:#cf222e;font-weight:600}.st-improved{color:#1a7f37}.st-worse,.st-failed{color:#cf222e}
.st-reward_hacking{color:#8250df}.nothing{background:#fff8c5;padding:1em;border:1px solid #d4a72c}
img{max-width:100%}.examples figure{display:inline-block;margin:.5em}
#rules td:first-child,#rules td:nth-child(7){white-space:nowrap}#rules td.status-accepted{color:#1a7f37}#rules td.status-flagged{color:#cf222e}
"""

HTML = (
    _HTML_RULE
    + """\
<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Remedy heuristics report, {{ date }}</title>
<style>
"""
    + _CSS
    + """\
</style></head>
<body>
<h1>Remedy heuristics report, {{ date }}</h1>
<p>Rules mined from verified diagnose-fix-verify cases. A rule reads “when a failure looks like the
condition, patches of the remedy family helped”; its effect is pooled over the cases it matches, with
a bootstrap confidence interval, and its q-value is Benjamini–Hochberg adjusted over the rules tested.
Only accepted rules reach a diagnosis.</p>
<h2 id="summary">Summary</h2>
<table class="summary">
<tr><th>date</th><td>{{ date }}</td></tr>
<tr><th>KB</th><td>{{ kb }}</td></tr>
<tr><th>verified cases in the KB</th><td>{{ verified_cases }}</td></tr>
{% if stopped_early %}<tr><th>candidates stopped early in a race (no verdict)</th><td>{{ stopped_early }}</td></tr>{% endif %}
<tr><th>accepted</th><td>{{ n.accepted }}</td></tr>
<tr><th>awaiting review (proposed)</th><td>{{ n.proposed }}</td></tr>
<tr><th>rejected</th><td>{{ n.rejected }}</td></tr>
<tr><th>flagged (accepted, evidence turned)</th><td>{{ n.flagged }}</td></tr>
</table>
{% if not n.total %}<p class="nothing"><strong>Nothing mined yet</strong>: this KB holds no rules (<code>remedy mine</code> has not run on it, or no candidate passed its false-discovery threshold). {{ how_to_mine | code }}</p>{% endif %}
<table id="rules"><caption>All rules</caption>
<thead><tr><th>rule</th><th>status</th><th>condition</th><th>remedy</th><th>support</th><th>wins</th><th>fixed</th><th>effect ({{ level }} CI)</th><th>q</th></tr></thead>
<tbody>
{% for r in all_rules %}
<tr class="rule-row"><td><a href="#rule-{{ r.id }}">{{ r.id }}</a></td><td class="status-{{ r.colour }}">{{ r.colour }}</td><td>{{ r.condition }}</td><td>{{ r.family }}</td><td>{{ r.support }}</td><td>{{ r.wins }}/{{ r.support }}</td><td>{{ r.fixed }}/{{ r.support }}</td><td>{{ r.effect }}</td><td>{{ r.q }}</td></tr>
{% endfor %}
</tbody></table>
{% if forest %}<figure><img alt="Forest plot of rule effects" src="{{ forest.uri }}"></figure>{% endif %}
<h2 id="accepted">Accepted rules</h2>
{% for r in accepted %}{{ rule_html(r) }}{% else %}<p>None.{% if n.flagged %} ({{ n.flagged }} accepted rules are flagged: see below.){% endif %}</p>{% endfor %}
<h2 id="proposed">Rules awaiting review</h2>
{% for r in proposed %}{{ rule_html(r) }}{% else %}<p>None.</p>{% endfor %}
<h2 id="flagged">Flagged rules</h2>
<p>Accepted rules whose evidence turned against them when the KB was re-mined; review them again.</p>
{% for r in flagged %}{{ rule_html(r) }}{% else %}<p>None.</p>{% endfor %}
<h2 id="rejected">Rejected rules</h2>
<details><summary>{{ rejected | length }} rejected rules (kept with their notes so re-mining does not propose them again)</summary>
{% for r in rejected %}{{ rule_html(r) }}{% else %}<p>None.</p>{% endfor %}
</details>
<h2 id="examples">Example cases</h2>
<div class="examples">
{% for e in examples %}<figure><img alt="before/after of {{ e.case.id }}" src="{{ e.uri }}"><figcaption><a href="#{{ e.case.anchor }}">{{ e.case.id }}</a>, {{ e.role }} of {{ e.rule }}</figcaption></figure>
{% else %}<p>None: no rule cites a case with a measured effect.</p>{% endfor %}
</div>
<h2 id="cases">Cases</h2>
{% for c in cases %}
<section class="case" id="{{ c.anchor }}"><h3>{{ c.id }}</h3>
{% if c.in_kb %}<ul>
<li>env {{ c.env }}, algo {{ c.algo }}, scenario {{ c.scenario }}</li>
<li>symptoms: {{ c.symptoms }}</li>
<li>patch: {{ c.patch }}</li>
<li>verification: <span class="st-{{ c.status }}">{{ c.status }}</span> ({{ c.stage }}, {{ c.comparison }}); effect {{ c.effect }}; seeds {{ c.seeds }}, budget {{ c.budget }} env steps</li>
{% if c.per_seed %}<li>per seed: {{ c.per_seed }}</li>{% endif %}
</ul>{% else %}<p>Not in this KB (deleted or not imported); the rule's record: {{ c.status }}, {{ c.effect }}.</p>{% endif %}
</section>
{% else %}<p>None.</p>{% endfor %}
</body></html>
"""
)
