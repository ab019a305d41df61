"""On a CUDA machine: a real torch.cuda.memory snapshot has the layout memfit reads and generates.

Skipped without CUDA. Run on a GPU box with ``pytest -m gpu tests/snapshot``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.snapshot.test_snapshot import BLOCK_KEYS, EVENT_KEYS, SEGMENT_KEYS

from memfit.snapshot import analyze_snapshot, load_snapshot

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_real_snapshot_matches_the_generated_layout_and_replays(tmp_path: Path) -> None:
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        model = torch.nn.Sequential(
            torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
        ).cuda()
        opt = torch.optim.AdamW(model.parameters())
        big = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")  # 64 MiB, live at the end
        for _ in range(2):
            model(torch.randn(256, 1024, device="cuda")).square().mean().backward()
            opt.step()
            opt.zero_grad()
        torch.cuda.synchronize()
        path = tmp_path / "real.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    snap = load_snapshot(path)  # the refusing unpickler reads a real one
    assert set(snap["segments"][0]) >= SEGMENT_KEYS
    assert set(snap["segments"][0]["blocks"][0]) >= BLOCK_KEYS
    alloc = next(e for e in snap["device_traces"][0] if e["action"] == "alloc")
    assert set(alloc) >= EVENT_KEYS
    whole = analyze_snapshot(path, stream=False)
    streamed = analyze_snapshot(path, stream=True)
    assert whole.devices[0].to_json() == streamed.devices[0].to_json()
    assert whole.allocated_bytes == torch.cuda.memory_allocated()
    assert whole.reserved_bytes == torch.cuda.memory_reserved()
    assert whole.largest[0].size_bytes >= big.numel()
    assert whole.devices[0].peak_allocated_bytes >= big.numel()
