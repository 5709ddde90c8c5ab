"""examples/_cli.py and each example's --help: every option has a sentence and its default."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.examples._run import EXAMPLES, load_example

NAMES = ("char_lm", "custom_strategy", "from_dataparallel")


def _help(name: str, env: dict[str, str]) -> str:
    # A wide terminal, so that no sentence is wrapped in the middle of a phrase the test looks for.
    done = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, f"{name}.py"), "--help"],
        env={**env, "COLUMNS": "1000"}, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _options(help_text: str) -> dict[str, str]:
    """Each option in the help's "options:" section, mapped to its help text on one line."""
    section = help_text.split("\noptions:\n", 1)[1].split("\n\n", 1)[0]
    options: dict[str, str] = {}
    for line in section.splitlines():
        if line.startswith("  -"):  # "  --seed SEED   seeds the ..." or "  --precision PRECISION" alone
            invocation, _, text = line.strip().partition("  ")
            name = invocation.split(", ")[-1].split(" ")[0]
            options[name] = text.strip()
        else:  # the help continued on the next line
            options[name] = f"{options[name]} {line.strip()}".strip()
    return options


@pytest.mark.slow  # a fresh Python per example
@pytest.mark.parametrize("name", NAMES)
def test_help_gives_every_option_a_sentence_and_its_default_and_ends_with_two_commands_that_parse(name, script_env):
    text = _help(name, script_env)
    options = _options(text)
    assert {"--strategy", "--devices", "--precision", "--max-epochs", "--max-steps", "--log-dir", "--seed", "--batch-size"} <= set(options)
    for option, help_ in options.items():
        if option == "--help":
            continue
        assert re.search(r"\(default: [^)]+", help_), f"{name} --help: {option} shows no default: {help_!r}"
        sentence = re.sub(r"\(default: [^)]*\)", "", help_).strip()
        assert len(sentence) >= 10, f"{name} --help: {option} has no help sentence: {help_!r}"

    commands = [line.strip() for line in text.split("\nexamples:\n", 1)[1].splitlines() if line.strip()]
    assert len(commands) >= 2 and all(c.startswith(f"python examples/{name}.py") for c in commands), text
    example = load_example(name)
    for command in commands:  # each one is accepted by the parser as written
        example.parse_args(shlex.split(command, comments=True)[2:])


@pytest.mark.slow
def test_char_lm_help_says_how_the_limits_combine_and_what_the_learning_rate_does(script_env):
    options = _options(_help("char_lm", script_env))
    assert "whichever comes first" in options["--max-steps"] and "whichever comes first" in options["--max-epochs"]
    assert "warms up" in options["--lr"] and "cosine" in options["--lr"]


def test_a_bad_devices_value_names_the_option_the_value_and_what_is_accepted(capsys):
    with pytest.raises(SystemExit):
        load_example("from_dataparallel").parse_args(["--devices", "0,x"])
    assert "argument --devices: '0,x' is not a device choice. Use 'auto', a count such as 2, or indices such as 0,1." in capsys.readouterr().err


def test_char_lm_refuses_a_head_count_that_does_not_divide_the_width_before_loading_anything(capsys):
    with pytest.raises(SystemExit):
        load_example("char_lm").parse_args(["--d-model", "96", "--n-heads", "5"])
    assert "--n-heads=5 does not divide --d-model=96. Pick a divisor of 96, such as 4." in capsys.readouterr().err
