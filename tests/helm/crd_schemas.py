"""JSON schemas for the two Prometheus Operator resources the chart can render.

kubernetes-validate knows only Kubernetes' own kinds. These cover the fields of
``monitoring.coreos.com/v1`` ServiceMonitor and PrometheusRule that the chart uses, with the
operator's types and duration format, and refuse any other field: a misspelt field fails here
instead of being silently dropped by the API server.
"""

from __future__ import annotations

from typing import Any

# The operator's Duration format (e.g. 30s, 1h30m).
DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
OBJECT_META = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string", "minLength": 1}, "labels": STRING_MAP},
}
LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["key", "operator"],
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}


def _resource(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": OBJECT_META,
            "spec": spec,
        },
    }


SERVICE_MONITOR = _resource(
    "ServiceMonitor",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["selector", "endpoints"],
        "properties": {
            "selector": LABEL_SELECTOR,
            "namespaceSelector": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "any": {"type": "boolean"},
                    "matchNames": {"type": "array", "items": {"type": "string"}},
                },
            },
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string"},
                        "interval": DURATION,
                        "scrapeTimeout": DURATION,
                        "honorLabels": {"type": "boolean"},
                    },
                },
            },
        },
    },
)

PROMETHEUS_RULE = _resource(
    "PrometheusRule",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["groups"],
        "properties": {
            "groups": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name", "rules"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "interval": DURATION,
                        "rules": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["expr"],
                                "properties": {
                                    "alert": {"type": "string"},
                                    "record": {"type": "string"},
                                    "expr": {"type": ["string", "integer"]},
                                    "for": DURATION,
                                    "keep_firing_for": DURATION,
                                    "labels": STRING_MAP,
                                    "annotations": STRING_MAP,
                                },
                            },
                        },
                    },
                },
            }
        },
    },
)

CRD_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
}
