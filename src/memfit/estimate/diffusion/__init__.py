"""Diffusion pipelines: inference and the diffusers training scripts, traced on fake tensors
(docs/diffusion.md)."""
