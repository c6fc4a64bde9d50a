"""The networked gossip peer (not built yet: see issue 6)."""
