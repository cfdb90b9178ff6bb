"""The bottom layer, shared by every package: the user-error type, the one-line argument
parser, and atomic file writes. No torch, no numpy."""
