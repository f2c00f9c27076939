"""Monitoring bundle generator: recording rules, alerts, dashboards, deploy files and runbook.

Everything under ``prometheus/``, ``alerts/``, ``dashboards/``, ``deploy/`` and
``docs/runbook.md`` is rendered from ``cachemon.catalog`` (names), ``cachemon.thresholds``
(numbers) and ``config.MonitoringConfig`` (selectors, URLs, uids), so they cannot
disagree. ``cachemon monitoring --check`` fails in CI when a committed file is stale.
"""
