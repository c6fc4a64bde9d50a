"""Robust aggregation rules and Byzantine attacks, in pure torch."""
