"""`memfit check` on a llama-server command line and on an Ollama Modelfile
(memfit.jobfiles.llamacpp_cmd): the file's settings reach `memfit llama-server` as llama.cpp
(through Ollama) would run them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.cli import main
from memfit.errors import SpecError
from memfit.jobfiles.llamacpp_cmd import (
    argv_from_llamacpp_command,
    argv_from_modelfile,
    is_llamacpp_command,
    is_modelfile,
    ollama_default_ctx,
)
from memfit.units import GiB


def test_a_llama_server_line_is_read_with_its_continuations() -> None:
    text = "# serve\n./build/bin/llama-server -m m.gguf \\\n  -c 8192 -ngl 99 --port 8080\n"
    assert is_llamacpp_command(text) and not is_modelfile(text)
    assert argv_from_llamacpp_command(text) == ["-m", "m.gguf", "-c", "8192", "-ngl", "99",
                                                "--port", "8080"]  # fmt: skip
    assert not is_llamacpp_command("vllm serve m --max-model-len 8192\n")


def test_ollama_s_default_context_follows_the_gpu_s_memory() -> None:
    assert ollama_default_ctx(12 * GiB) == 4096
    assert ollama_default_ctx(32 * GiB) == 32768
    assert ollama_default_ctx(80 * GiB) == 262144


def test_a_modelfile_runs_num_ctx_times_the_parallel_slots(tmp_path: Path) -> None:
    text = "FROM ./weights/model.gguf\nPARAMETER num_ctx 8192\nPARAMETER num_gpu 20\n"
    path = tmp_path / "Modelfile"
    argv, notes = argv_from_modelfile(text, path=str(path), capacity_bytes=12 * GiB,
                                      env={"OLLAMA_NUM_PARALLEL": "2"})  # fmt: skip
    assert argv[0] == str(tmp_path.resolve() / "weights" / "model.gguf")  # beside the Modelfile
    assert argv[1:] == ["-c", "16384", "-np", "2", "-b", "1024", "-ub", "512", "-ngl", "20"]
    assert any("8192 x 2" in n for n in notes)


def test_a_modelfile_without_num_ctx_takes_ollama_s_default_and_its_environment() -> None:
    argv, notes = argv_from_modelfile("FROM qwen3\n", path="Modelfile", capacity_bytes=40 * GiB,
                                      env={"OLLAMA_KV_CACHE_TYPE": "q8_0"})  # fmt: skip
    assert argv[:3] == ["qwen3-8b:Q4_K_M", "-c", "32768"]  # qwen3:latest is the 8B
    assert argv[-4:] == ["-ctk", "q8_0", "-ctv", "q8_0"]
    assert any("Ollama's default" in n for n in notes)
    argv, _ = argv_from_modelfile("FROM qwen3\n", path="Modelfile", capacity_bytes=40 * GiB,
                                  env={"OLLAMA_CONTEXT_LENGTH": "2048"})  # fmt: skip
    assert argv[1:3] == ["-c", "2048"]


def test_a_bad_modelfile_says_what_is_wrong() -> None:
    with pytest.raises(SpecError, match=r"PARAMETER num_ctx \('lots'\) must be a whole number"):
        argv_from_modelfile("FROM qwen3\nPARAMETER num_ctx lots\n", path="M", capacity_bytes=GiB,
                            env={})  # fmt: skip


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["check", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_check_answers_a_modelfile_as_memfit_llama_server_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("OLLAMA_NUM_PARALLEL", "OLLAMA_CONTEXT_LENGTH", "OLLAMA_KV_CACHE_TYPE",
                "OLLAMA_FLASH_ATTENTION"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text("FROM llama3.1:8b\nPARAMETER num_ctx 16384\nSYSTEM hi\n")
    code, out, _ = _check(capsys, str(modelfile), "--gpu", "RTX-3060", "--json")
    checked = json.loads(out)
    direct_code = main(["llama-server", "llama-3.1-8b:Q4_K_M", "-c", "16384", "-np", "1",
                        "-b", "512", "--gpu", "RTX-3060", "--json"])  # fmt: skip
    direct = json.loads(capsys.readouterr()[0])
    assert code == direct_code == 0
    assert checked["verdict"] == direct["verdict"] and checked["n_ctx"] == 16384
    assert any("llama3.1:8b" in n for n in checked["notes"])
    code, _, err = _check(capsys, str(modelfile))
    assert code == 2 and "pass --gpu NAME" in err


def test_check_answers_a_llama_server_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    line = tmp_path / "serve.sh"
    line.write_text("llama-server -m llama-3.1-70b:Q4_K_M -c 8192 -ngl 99\n")
    code, out, _ = _check(capsys, str(line), "--gpu", "RTX-4090")
    assert code == 1 and "does not fit" in out.lower()


def test_a_server_line_with_an_unclosed_quote_is_refused_by_name() -> None:
    """One splitter for every server command line (vllm_cmd.command_words): an unclosed quote
    is a clear SpecError, not shlex's bare ValueError."""
    from memfit.jobfiles.sglang_cmd import argv_from_sglang_command

    with pytest.raises(SpecError, match=r"the llama-server command line cannot be split"):
        argv_from_llamacpp_command("llama-server -m 'x.gguf -c 8192\n")
    with pytest.raises(SpecError, match=r"the SGLang command line cannot be split"):
        argv_from_sglang_command("python -m sglang.launch_server --model-path 'x\n")
