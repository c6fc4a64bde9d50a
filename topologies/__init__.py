"""Graphs that decide who gossips with whom, their mixing weights, and how fast they agree."""
