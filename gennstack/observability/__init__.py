"""Metrics, dashboards, alerts and autoscaling signals (kube-prometheus-stack, KEDA)."""
