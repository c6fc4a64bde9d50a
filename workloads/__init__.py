"""What peers train: data sets (no download at run time), partitions across peers, small models."""
