"""A model of PyTorch's CUDA caching allocator, replayed by the trace, the derived forms,
the variable-length runs and the snapshot generator (docs/decisions.md, "One job, one answer,
one door")."""
