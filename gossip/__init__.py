"""Per-node decentralized update rules and compressors, shared by the simulator and the peer."""
