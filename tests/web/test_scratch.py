"""A pasted config is on disk only while its request runs (issue 33: every distinct pasted
config was kept until the server stopped, 300 requests -> 301 folders)."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import pytest
from tests.web.test_api import get

from memfit.web.app import _run_job
from memfit.web.scratch import PastedConfigs
from memfit.web.workers import Busy, Outcome

CONFIG = '{"model_type": "gpt2", "n_layer": 2}'


class _Pool:
    """Answers with what the worker would read: the pasted file, there during the job."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def run(self, argv: tuple[str, ...], *, heavy: bool) -> Outcome:
        text = (Path(argv[1]) / "config.json").read_text()
        if self.fail:
            raise RuntimeError("the worker died")
        return Outcome(exit_code=0, stdout=text, stderr="", wall_s=0.0)


def _job(pasted: PastedConfigs, text: str = CONFIG):
    from memfit.cli import build_parser
    from memfit.web.query import build_job

    return build_job(build_parser(), "estimate", [("config", text)], pasted=pasted,
                     allow_paths=False)  # fmt: skip


def test_the_config_is_written_for_the_job_and_removed_after_it(tmp_path: Path) -> None:
    pasted = PastedConfigs(tmp_path)
    assert _run_job(_Pool(), pasted, _job(pasted)).stdout == CONFIG  # the worker read it
    assert pasted.held() == []
    with pytest.raises(RuntimeError, match="the worker died"):
        _run_job(_Pool(fail=True), pasted, _job(pasted))
    assert pasted.held() == []  # removed on the failing path too


def test_two_requests_share_one_config_and_the_scratch_area_is_bounded(tmp_path: Path) -> None:
    pasted = PastedConfigs(tmp_path, max_held=2)
    with pasted.holding(CONFIG) as a, pasted.holding(CONFIG) as b:
        assert a == b and pasted.held() == [a]
        with (
            pasted.holding('{"n_layer": 3}'),
            pytest.raises(Busy, match=r"2 pasted configs are being estimated"),
            pasted.holding('{"n_layer": 4}'),
        ):
            pass
        assert (a / "config.json").read_text() == CONFIG  # still there for the other request
    assert pasted.held() == []


def test_many_distinct_pasted_configs_leave_no_folder_behind(tmp_path: Path) -> None:
    from tests.conftest import TINY_LLAMA

    from memfit.cli import build_parser, main
    from memfit.web.serve import running

    pasted = PastedConfigs(tmp_path)
    with running(run=main, parser_factory=build_parser, n_workers=1, pasted=pasted) as base:
        for n in range(12):
            text = json.dumps({**TINY_LLAMA, "num_hidden_layers": n + 1})
            query = urllib.parse.urlencode({"config": text, "engine": "analytic"})
            status, _, body = get(f"{base}/api/estimate?{query}")
            assert status == 200, body
    assert list(tmp_path.iterdir()) == []
