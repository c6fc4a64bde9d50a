"""The vectorized n-peer network simulator (not built yet: see issue 5)."""
