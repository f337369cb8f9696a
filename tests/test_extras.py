"""A command whose optional extra is missing says in one line what to install, and exits 2."""

from __future__ import annotations

import sys

import pytest

from tests.support import cli


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["serve"], "wispsim serve"),
        (["swarm"], "wispsim swarm"),
        (["validate"], "wispsim validate"),
    ],
)
@pytest.mark.parametrize("gone", ["uvicorn", "httpx", "fastapi"])
def test_serve_commands_without_the_serve_extra(
    capsys, monkeypatch, args: list[str], what: str, gone: str
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, gone, None)  # importing it now raises ImportError
    code, _, err = cli(capsys, monkeypatch, *args)
    assert code == 2
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert what in lines[0] and gone in lines[0] and "pip install 'wispsim[serve]'" in lines[0]


def test_profile_show_of_a_typo_names_the_command_not_a_scenario(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    code, _, err = cli(capsys, monkeypatch, "profile", "show", "a100-qwen3-23b")
    assert code == 2
    assert "wispsim profile show: NAME: no profile 'a100-qwen3-23b'" in err
    assert "scenario" not in err and "a100-qwen3-32b" in err  # the shipped names, to pick from


def test_replay_of_a_table_that_is_no_log_says_so(capsys, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = tmp_path / "summary.csv"
    table.write_text("class,devices,violation_rate\nall,4,0.0\n")
    code, _, err = cli(capsys, monkeypatch, "replay", str(table))
    assert code == 2 and "not a replay log" in err and "run --log" in err
    assert err.count("device") <= 1  # the columns are not listed twice
