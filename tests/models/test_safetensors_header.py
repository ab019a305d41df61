"""Reading safetensors headers: exact counts from real files, clear errors on broken ones."""

from __future__ import annotations

import json
import struct

import pytest

from memfit.errors import ModelConfigError
from memfit.models import read_safetensors_header
from memfit.models.safetensors_header import find_safetensors, summarize_safetensors

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _write(path, tensors):
    safetensors_torch.save_file(tensors, str(path))
    return path


def _raw_file(path, header: bytes, declared: int | None = None, data: bytes = b""):
    n = len(header) if declared is None else declared
    path.write_bytes(struct.pack("<Q", n) + header + data)
    return path


def test_header_gives_exact_element_counts_per_dtype(tmp_path):
    path = _write(
        tmp_path / "model.safetensors",
        {
            "embed": torch.zeros(3, 4, dtype=torch.bfloat16),
            "norm": torch.zeros(5, dtype=torch.float32),
            "proj": torch.zeros(2, 2, 2, dtype=torch.bfloat16),
            "codes": torch.zeros(7, dtype=torch.int8),
        },
    )
    info = summarize_safetensors([path])
    assert info.n_params == 12 + 5 + 8 + 7
    assert info.dtype_counts == {"BF16": 20, "F32": 5, "I8": 7}
    assert info.total_bytes == 20 * 2 + 5 * 4 + 7 * 1
    assert info.files == (str(path),)
    assert set(read_safetensors_header(path)) >= {"embed", "norm", "proj", "codes"}


def test_metadata_entry_is_not_counted_as_a_tensor(tmp_path):
    path = tmp_path / "m.safetensors"
    safetensors_torch.save_file({"w": torch.zeros(4)}, str(path), metadata={"format": "pt"})
    assert read_safetensors_header(path)["__metadata__"] == {"format": "pt"}
    assert summarize_safetensors([path]).n_params == 4


def test_a_file_shorter_than_the_length_prefix_is_rejected(tmp_path):
    path = tmp_path / "tiny.safetensors"
    path.write_bytes(b"\x01\x02")
    with pytest.raises(ModelConfigError, match=r"tiny\.safetensors.*shorter than the 8-byte"):
        read_safetensors_header(path)


def test_a_header_declared_over_100_mb_is_rejected_without_reading_it(tmp_path):
    path = _raw_file(tmp_path / "huge.safetensors", b"{}", declared=100_000_001)
    with pytest.raises(ModelConfigError, match="exceeds the 100 MB limit"):
        read_safetensors_header(path)


def test_a_header_longer_than_the_file_says_truncated(tmp_path):
    path = _raw_file(tmp_path / "cut.safetensors", b'{"a": 1', declared=4096)
    with pytest.raises(ModelConfigError, match="truncated.*re-download it"):
        read_safetensors_header(path)


def test_a_garbage_header_is_rejected_with_the_file_name(tmp_path):
    path = _raw_file(tmp_path / "junk.safetensors", b"\xff\xfe not json")
    with pytest.raises(ModelConfigError, match=r"junk\.safetensors.*not UTF-8 JSON"):
        read_safetensors_header(path)


def test_a_header_that_is_not_an_object_is_rejected(tmp_path):
    path = _raw_file(tmp_path / "list.safetensors", b"[1, 2]")
    with pytest.raises(ModelConfigError, match="header is a JSON list, not an object"):
        read_safetensors_header(path)


def test_a_tensor_entry_without_shape_is_rejected(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "data_offsets": [0, 4]}}).encode()
    path = _raw_file(tmp_path / "noshape.safetensors", header, data=b"\0" * 4)
    with pytest.raises(ModelConfigError, match="tensor 'w' lacks a valid dtype, shape"):
        read_safetensors_header(path)


def test_a_file_cut_inside_the_tensor_data_is_reported_truncated(tmp_path):
    full = _write(tmp_path / "full.safetensors", {"w": torch.zeros(256)})
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(full.read_bytes()[:-100])
    with pytest.raises(ModelConfigError, match=r"need 1024 bytes of data but the file holds 924"):
        read_safetensors_header(cut)


def test_sharded_checkpoints_are_read_through_their_index(tmp_path):
    _write(tmp_path / "model-00001-of-00002.safetensors", {"a": torch.zeros(10)})
    _write(tmp_path / "model-00002-of-00002.safetensors", {"b": torch.zeros(3, dtype=torch.int32)})
    _write(tmp_path / "stray.safetensors", {"c": torch.zeros(1000)})  # not in the index
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    info = summarize_safetensors(find_safetensors(tmp_path))
    assert (info.n_params, info.dtype_counts) == (13, {"F32": 10, "I32": 3})


def test_an_index_naming_a_missing_shard_says_which(tmp_path):
    _write(tmp_path / "model-00001-of-00002.safetensors", {"a": torch.zeros(10)})
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ModelConfigError, match=r"1 shard\(s\).*model-00002-of-00002\.safetensors"):
        find_safetensors(tmp_path)


def test_an_unreadable_index_is_reported_with_its_path(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(ModelConfigError, match=r"index\.json: not a readable safetensors index"):
        find_safetensors(tmp_path)


def test_a_missing_file_is_a_model_config_error(tmp_path):
    with pytest.raises(ModelConfigError, match=r"absent\.safetensors.* does not exist"):
        read_safetensors_header(tmp_path / "absent.safetensors")


def test_a_safetensors_fifo_is_refused_without_blocking(tmp_path):
    import os

    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(ModelConfigError, match="FIFO"):
        read_safetensors_header(fifo)


def test_an_index_naming_a_shard_outside_its_folder_is_refused(tmp_path):
    import json

    from memfit.models.safetensors_header import find_safetensors

    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "../../etc/passwd"}})
    )
    with pytest.raises(ModelConfigError, match="outside its folder"):
        find_safetensors(tmp_path)
