"""The bottom layer, shared by every package: the user-error type, the one-line argument
parser, atomic file writes, cooperative yield points and CPU affinity. No torch, no numpy."""
