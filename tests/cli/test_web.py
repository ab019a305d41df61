"""`memfit web` without its extra says what to install (exit 2)."""

from __future__ import annotations

import importlib.util

import pytest

from memfit.cli import main


def test_memfit_web_without_the_extra_names_the_install(monkeypatch, capsys) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "starlette" else real(name)
    )
    assert main(["web"]) == 2
    assert "pip install 'memfit[web]'" in capsys.readouterr().err


def test_memfit_web_refuses_a_port_in_use(capsys) -> None:
    pytest.importorskip("uvicorn")
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["web", "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
