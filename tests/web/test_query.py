"""A web query as the memfit command line it stands for (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memfit.cli import build_parser
from memfit.errors import SpecError
from memfit.web.query import build_job, options
from memfit.web.scratch import PastedConfigs

PARSER = build_parser()  # the CLI's, as `memfit web` injects it


def job(command: str = "estimate", allow_paths: bool = True, **params: str):
    return build_job(PARSER, command, params.items(), pasted=None, allow_paths=allow_paths)


def test_the_query_becomes_the_cli_argv_with_json() -> None:
    j = job(model="gpt2", batch="4", **{"lora-rank": "16", "prepare-kbit": "1"})
    assert j.argv == ("estimate", "gpt2", "--batch=4", "--lora-rank=16", "--prepare-kbit", "--json")
    assert j.command_line() == "memfit estimate gpt2 --batch 4 --lora-rank 16 --prepare-kbit"
    assert j.command_line(json=True).endswith(" --json")


def test_only_an_analytic_estimate_is_light() -> None:
    assert not job(model="gpt2", engine="analytic").heavy
    assert job(model="gpt2").heavy and job("plan", model="gpt2", gpu="T4").heavy


def test_a_negative_value_stays_the_option_value() -> None:
    assert "--batch=-1" in job(model="gpt2", batch="-1").argv


def test_a_switch_takes_only_on_or_off() -> None:
    assert "--prepare-kbit" not in job(model="gpt2", **{"prepare-kbit": "0"}).argv
    with pytest.raises(SpecError, match=r"prepare-kbit is a switch: pass 1 or 0, got 'maybe'"):
        job(model="gpt2", **{"prepare-kbit": "maybe"})


def test_options_come_from_the_cli_parser_less_the_refused_ones() -> None:
    keys = set(options(PARSER, "estimate"))
    assert {"batch", "seq", "lora-rank", "quant", "gpu", "engine"} <= keys
    assert not {"trust-remote-code", "json", "help"} & keys


def test_a_server_beyond_localhost_reads_no_local_paths(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"is a local path; this server listens beyond localhost"):
        job(model=str(tmp_path), allow_paths=False)
    assert job(model="Qwen/Qwen2.5-3B", allow_paths=False).argv[1] == "Qwen/Qwen2.5-3B"
    assert job(model=str(tmp_path), allow_paths=True).argv[1] == str(tmp_path)


def test_a_pasted_config_is_checked_and_named_by_content_but_not_written(tmp_path: Path) -> None:
    text = '{"model_type": "gpt2", "n_layer": 2}'
    pasted = PastedConfigs(tmp_path)
    a = build_job(PARSER, "estimate", [("config", text)], pasted=pasted, allow_paths=False)
    b = build_job(PARSER, "estimate", [("config", text)], pasted=pasted, allow_paths=False)
    assert a.argv == b.argv and a.config == text
    assert Path(a.argv[1]) == pasted.folder_for(text) and list(tmp_path.iterdir()) == []
    with pytest.raises(SpecError, match=r"config \(12001 characters\) is longer than 12000"):
        build_job(
            PARSER,
            "estimate",
            [("config", "{" + " " * 12_000)],
            pasted=pasted,
            allow_paths=True,
        )
    with pytest.raises(SpecError, match=r"this server takes no pasted config.json"):
        build_job(PARSER, "estimate", [("config", text)], pasted=None, allow_paths=True)


def test_an_unknown_command_is_named() -> None:
    with pytest.raises(SpecError, match=r"unknown API command 'doctor': use one of estimate"):
        job("doctor", model="gpt2")


def test_the_host_header_is_read_without_its_port() -> None:
    from memfit.web.app import request_host

    def scope(host: bytes) -> dict:
        return {"headers": [(b"host", host)]}

    assert request_host(scope(b"127.0.0.1:8000")) == "127.0.0.1"
    assert request_host(scope(b"[::1]:8000")) == "[::1]"
    assert request_host(scope(b"evil.example")) == "evil.example"


def test_the_planners_carry_every_job_field_of_the_form() -> None:
    """issue 29: the page's plan request dropped quant and checkpointing; a planner takes what it
    can (the job's ``--quant``) and names the techniques it searches itself."""
    fields = {"quant": "nf4", "checkpointing": "full", "lora-rank": "16", "precision": "bf16-true"}
    plan = job("plan", model="llama-3.1-8b", gpu="T4", **fields)
    assert "--quant=nf4" in plan.argv and "--lora-rank=16" in plan.argv
    assert "--precision=bf16-true" in plan.argv
    assert plan.not_taken == ("checkpointing=full",)
    # upgrade takes the job's recipe as plan does (issue 29: a LoRA job asked which GPU to buy)
    upgrade = job("upgrade", model="llama-3.1-8b", gpu="T4", **fields)
    assert "--quant=nf4" in upgrade.argv and "--lora-rank=16" in upgrade.argv
    assert "--precision=bf16-true" in upgrade.argv
    assert upgrade.not_taken == ("checkpointing=full",)
    assert job("plan", model="gpt2", gpu="T4", quant="none").not_taken == ()
    with pytest.raises(SpecError, match="memfit plan takes no option 'bogus'"):
        job("plan", model="gpt2", bogus="1")
