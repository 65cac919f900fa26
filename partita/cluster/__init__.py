"""Clusters on paper: hardware as data (``hardware``), and, built on it, the cost model
(``cost``), the per-rank memory report (``memory``) and the simulator of per-rank programs
(``simulator``; docs/cluster.md)."""

from __future__ import annotations

from .hardware import (Cluster, ClusterError, Device, Efficiency, Link, format_quantity, list_clusters, load_cluster,
                       parse_cluster, parse_quantity)
from .memory_report import MemoryReport, memory_report
from .simulator import SimResult, SimulationError, simulate

__all__ = ["Cluster", "ClusterError", "Device", "Efficiency", "Link", "MemoryReport", "SimResult", "SimulationError",
           "format_quantity", "list_clusters", "load_cluster", "memory_report", "parse_cluster", "parse_quantity",
           "simulate"]
