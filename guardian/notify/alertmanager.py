"""Alertmanager's webhook payload (version 4) as guardian alerts. Pure.

Alertmanager already grouped what it sends, so these alerts skip guardian's
group wait; everything else (repeat, escalation, storm limit, quiet hours,
ack) applies as to guardian's own alerts. The subject is the alert's
``engine`` label, else ``gpu``, else ``instance``; the severity label maps
``page``/``critical`` to a page, ``warning`` to a warning, anything else to
info (logged, not texted).
"""

from __future__ import annotations

from typing import Any

from guardian.notify.alerts import Alert, Severity


class PayloadError(ValueError):
    """Not an Alertmanager webhook payload (the message says what is missing)."""


def parse(payload: Any) -> list[tuple[Alert, bool]]:
    """(alert, firing) for each alert in the payload."""
    if not isinstance(payload, dict) or not isinstance(payload.get("alerts"), list):
        raise PayloadError('expected Alertmanager\'s webhook JSON: an object with an "alerts" list')
    if str(payload.get("version", "4")) != "4":
        raise PayloadError(f"webhook payload version {payload.get('version')!r}; guardian reads version 4")
    out = []
    for i, item in enumerate(payload["alerts"]):
        if not isinstance(item, dict) or not isinstance(item.get("labels"), dict):
            raise PayloadError(f"alerts[{i}] has no labels")
        labels = {str(k): str(v) for k, v in item["labels"].items()}
        annotations: dict[str, Any] = item["annotations"] if isinstance(item.get("annotations"), dict) else {}
        name = labels.get("alertname")
        if not name:
            raise PayloadError(f"alerts[{i}] has no alertname label")
        subject = labels.get("engine") or labels.get("gpu") or labels.get("instance") or ""
        summary = str(annotations.get("summary") or f"{name} {subject}".strip())
        out.append((Alert(name, subject, _severity(labels.get("severity", "")), summary, "alertmanager"),
                    item.get("status", payload.get("status")) == "firing"))  # fmt: skip
    return out


def _severity(label: str) -> Severity:
    label = label.lower()
    if label in ("page", "critical"):
        return "page"
    if label == "warning":
        return "warning"
    return "info"
