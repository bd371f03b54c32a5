"""ResumeConfig (gennstack/resume/config.py) and the `gennstack resume serve` arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gennstack.cli import build_parser
from gennstack.config_base import ConfigError
from gennstack.resume.config import ModelResume, ResumeConfig


def test_defaults_are_the_agreed_bounds() -> None:
    config = ResumeConfig()
    assert (config.max_attempts, config.max_replay_tokens, config.deadline_s, config.upstream_idle_timeout_s) == (3, 32768, 900.0, 30.0)
    assert config.models == {}
    assert ModelResume() == ModelResume(resume=True, harmony=False, reason_off=None)


def test_load_reads_models_keyed_by_served_name(tmp_path: Path) -> None:
    path = tmp_path / "resume.json"
    path.write_text(json.dumps({"models": {"openai/gpt-oss-120b": {"harmony": True},
                                           "neuron-model": {"resume": False, "reason_off": "no return_token_ids"}},
                                "deadline_s": 60, "max_attempts": 5}))
    config = ResumeConfig.load(path)
    assert config.model("openai/gpt-oss-120b") == ModelResume(harmony=True)
    assert config.model("neuron-model").reason_off == "no return_token_ids"
    assert config.model("other") is None
    assert config.deadline_s == 60.0 and config.max_attempts == 5
    assert ResumeConfig.load(_write(tmp_path, config.to_json())) == config


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "again.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("data", "message"), [
    ({"max_attempts": "3"}, "max_attempts"),
    ({"max_attempts": -1}, "max_attempts"),
    ({"deadline_s": 0}, "deadline_s"),
    ({"upstream_idle_timeout_s": -1}, "upstream_idle_timeout_s"),
    ({"max_replay_tokens": 0}, "max_replay_tokens"),
    ({"bogus": 1}, "bogus"),
    ({"models": {"m": {"resume": "yes"}}}, "models.m.resume"),
    ({"models": {"m": {"reason_off": "why"}}}, "reason_off"),
])
def test_bad_values_name_their_key(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        ResumeConfig.from_data(data)


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing.json: cannot read"):
        ResumeConfig.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ConfigError, match="bad.json: not JSON"):
        ResumeConfig.load(bad)
    bad.write_text("[1]")
    with pytest.raises(ConfigError, match="top level must be a JSON object"):
        ResumeConfig.load(bad)


def test_serve_arguments_parse() -> None:
    args = build_parser().parse_args(["resume", "serve", "--listen", "127.0.0.1:9000", "--upstream", "http://127.0.0.1:10000/",
                                      "--config", "r.json", "--metrics-listen", "[::1]:9100"])
    assert args.listen == ("127.0.0.1", 9000)
    assert args.upstream == "http://127.0.0.1:10000"
    assert args.config == Path("r.json")
    assert args.metrics_listen == ("::1", 9100)


@pytest.mark.parametrize("argv", [
    ["--listen", "127.0.0.1", "--upstream", "http://x:1", "--config", "c"],
    ["--listen", "h:0", "--upstream", "http://x:1", "--config", "c"],
    ["--listen", "h:1", "--upstream", "ftp://x", "--config", "c"],
    ["--listen", "h:1", "--upstream", "http://x:1"],
])
def test_serve_rejects_bad_arguments(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["resume", "serve", *argv])
    assert exit_info.value.code == 2


def test_serve_with_a_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"max_attempts": "x"}')
    args = build_parser().parse_args(["resume", "serve", "--listen", "127.0.0.1:9", "--upstream", "http://127.0.0.1:1",
                                      "--config", str(bad)])
    assert args.func(args) == 2
    assert "max_attempts" in capsys.readouterr().err
