"""GGUF headers: memfit reads the metadata and tensor table through its bounded reader, with
gguf's own type tables, and agrees with gguf.GGUFReader on a complete file."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from memfit.errors import MissingDependencyError, ModelConfigError
from memfit.models.ggml_types import GGML_BLOCKS, tensor_type, use_more_bits
from memfit.models.gguf import load_gguf, read_gguf_header, resolve_gguf
from memfit.userfiles import UserFileError

gguf = pytest.importorskip("gguf")
HEADERS = Path(__file__).parents[1] / "fixtures" / "gguf"
LLAMA = HEADERS / "llama-3.2-1b-Q4_K_M.header.gguf"
QWEN = HEADERS / "qwen2.5-0.5b-Q8_0.header.gguf"


def test_memfits_ggml_type_table_is_ggmls() -> None:
    for qtype, (block, size) in gguf.GGML_QUANT_SIZES.items():
        if qtype.name in GGML_BLOCKS:
            assert GGML_BLOCKS[qtype.name] == (block, size), qtype.name
    assert GGML_BLOCKS["Q4_K"] == (256, 144) and GGML_BLOCKS["Q8_0"] == (32, 34)


def test_a_shipped_header_reads_as_its_architecture() -> None:
    m = load_gguf(LLAMA)
    assert (m.arch, m.n_layer, m.n_embd, m.n_head, m.n_head_kv[0]) == ("llama", 16, 2048, 32, 8)
    assert (m.n_vocab, m.n_ctx_train, m.file_type) == (128256, 131072, "Q4_K_M")
    assert not m.has_output  # tied embeddings: token_embd is the output
    q = load_gguf(QWEN)
    assert (q.arch, q.n_layer, q.n_head_kv[0], q.n_vocab) == ("qwen2", 24, 2, 151936)
    assert any(t.name == "blk.0.attn_q.bias" for t in q.tensors)


def test_reader_agrees_with_gguf_reader_on_a_complete_file(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_uint32("test.array_len", 7)
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(5000)])  # skipped, counted
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 32), dtype=np.float16))
    q8 = gguf.quants.quantize(np.ones((4, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    meta, tensors = read_gguf_header(path)
    ref = gguf.GGUFReader(path)
    assert [(t.name, t.ggml_type, t.n_bytes) for t in tensors] == [
        (t.name, t.tensor_type.name, int(t.n_bytes)) for t in ref.tensors
    ]
    assert meta["tokenizer.ggml.tokens"] == ("<array>", 5000)


def test_the_bundled_mix_gives_the_header_sizes() -> None:
    assert resolve_gguf("llama-3.2-1b:Q4_K_M").total_bytes == load_gguf(LLAMA).total_bytes
    assert resolve_gguf("qwen2.5-0.5b", "Q8_0").total_bytes == load_gguf(QWEN).total_bytes


def test_q4_k_m_gives_attn_v_and_ffn_down_q6_k_on_the_layers_use_more_bits_picks() -> None:
    picked = [i for i in range(32) if use_more_bits(i, 32)]
    assert len(picked) == 16 and picked[:5] == [0, 1, 2, 3, 6]
    kw = {"n_layers": 32, "tied": False}
    assert tensor_type("Q4_K_M", "blk.6.attn_v.weight", (4096, 1024), layer=6, **kw) == "Q6_K"
    assert tensor_type("Q4_K_M", "blk.7.attn_v.weight", (4096, 1024), layer=7, **kw) == "Q4_K"
    assert tensor_type("Q4_K_M", "output.weight", (4096, 128256), layer=None, **kw) == "Q6_K"
    assert tensor_type("Q4_K_M", "blk.0.ffn_down.weight", (4864, 896), layer=0, **kw) == "Q6_K"
    assert tensor_type("Q4_K_M", "blk.7.ffn_down.weight", (4864, 896), layer=7, **kw) == "Q4_K"
    # Qwen2.5-0.5B's rows of 896 are no whole number of 256-blocks: Q4_K falls back to Q5_0
    assert tensor_type("Q4_K_M", "blk.7.ffn_up.weight", (896, 4864), layer=7, **kw) == "Q5_0"


def test_a_truncated_header_is_refused_naming_the_file(tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(LLAMA.read_bytes()[:3000])
    with pytest.raises(UserFileError, match=r"cut.gguf.*ends inside its header"):
        load_gguf(cut)


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(ModelConfigError, match=r"not a GGUF file"):
        load_gguf(bad)


def test_without_gguf_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'memfit\[llamacpp\]'"):
        load_gguf(LLAMA)
    assert resolve_gguf("llama-3.2-1b:Q8_0").file_type == "Q8_0"  # a bundled mix needs no gguf


def test_a_recurrent_architecture_is_refused_as_not_modelled(tmp_path: Path) -> None:
    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(path, "mamba")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_uint32("mamba.ssm.state_size", 16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with pytest.raises(ModelConfigError, match=r"'mamba' keeps a recurrent state.*not model"):
        load_gguf(path)
