"""Variable-length runs: a sequence-length distribution, the steps it draws and the
allocator replayed over them (docs/planning.md)."""
