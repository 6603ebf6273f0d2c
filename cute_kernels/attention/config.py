"""Limits that the attention kernels and their host code share (kernels import this module,
never the api module)."""

# Splits per (batch, head group) at most: the decode kernels keep one merge weight per split
# and head in shared memory.
MAX_DECODE_SPLITS = 64
# Split counts up to this merge inside a thread-block cluster (8: the portable cluster size).
MAX_CLUSTER_SPLITS = 8
