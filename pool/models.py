"""Nodes, GPUs, health and heartbeats from node agents, logical pools and quotas."""
