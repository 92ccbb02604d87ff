"""The command line's help, and what it lets third-party libraries print."""

import argparse
import logging
import os
import warnings

import pytest
import structlog

from fairagents.cli import QUIET_ENV, build_parser, main


def _commands(parser, path=("fairagents",)):
    """``(path, parser)`` for the parser and every command and subcommand under it, with their listed summaries."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                assert summaries.get(name), f"{' '.join(path)} lists {name} without a summary"
                yield from _commands(sub, (*path, name))


def test_every_command_has_a_description_and_every_option_its_help():
    seen = []
    for path, parser in _commands(build_parser()):
        seen.append(" ".join(path[1:]))
        assert parser.description and "\n" not in parser.description, path
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help and action.help != argparse.SUPPRESS, (path, action.dest)
    assert {"demo", "serve", "models build", "bench scheduler", "bench run", "bench schema"} <= set(seen)


@pytest.mark.parametrize("argv", [["-v", "bench", "schema"], ["bench", "-v", "schema"], ["bench", "schema", "-v"]])
def test_verbose_is_accepted_before_or_after_the_command(argv):
    assert build_parser().parse_args(argv).verbose
    assert not build_parser().parse_args(["bench", "schema"]).verbose


@pytest.fixture
def unset_quiet_env(monkeypatch):
    for name in QUIET_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("unset_quiet_env")
def test_a_command_keeps_third_party_libraries_quiet_by_default(capsys):
    assert main(["bench", "schema"]) == 0
    assert {name: os.environ.get(name) for name in QUIET_ENV} == QUIET_ENV
    assert logging.getLogger("vllm").level == logging.ERROR  # also before vLLM configures its own logging
    assert not structlog.get_logger().is_enabled_for(logging.INFO)
    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("always", category=UserWarning, module="fairagents")
        warnings.warn_explicit("noise", UserWarning, "torch/storage.py", 1, module="torch.storage")
        warnings.warn_explicit("ours", UserWarning, "fairagents/arbiter.py", 1, module="fairagents.arbiter")
    assert [str(w.message) for w in caught] == ["ours"]
    assert capsys.readouterr().err == ""


@pytest.mark.usefixtures("unset_quiet_env")
def test_verbose_leaves_third_party_libraries_their_own_defaults(capsys):
    assert main(["bench", "schema", "--verbose"]) == 0
    assert not any(name in os.environ for name in QUIET_ENV)
    assert structlog.get_logger().is_enabled_for(logging.INFO)


def test_an_environment_set_by_the_user_wins(monkeypatch, capsys):
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    assert main(["bench", "schema"]) == 0
    assert os.environ["VLLM_LOGGING_LEVEL"] == "DEBUG"
