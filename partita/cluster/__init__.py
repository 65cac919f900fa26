"""Clusters on paper: hardware as data (``hardware``), and, built on it, the cost model and the
simulator of per-rank programs (docs/cluster.md)."""

from __future__ import annotations

from .hardware import (Cluster, ClusterError, Device, Efficiency, Link, format_quantity, list_clusters, load_cluster,
                       parse_cluster, parse_quantity)

__all__ = ["Cluster", "ClusterError", "Device", "Efficiency", "Link", "format_quantity", "list_clusters", "load_cluster",
           "parse_cluster", "parse_quantity"]
