"""TOML that rigdeck writes (tui.model.tomlwrite): tomli-w's text, tables under their own headers."""

from __future__ import annotations

import tomllib

from tui.model.tomlwrite import dumps, table


def test_an_array_entry_gets_its_own_header_and_reads_back() -> None:
    host = {"name": "h1", "port": 22, "labels": ["a"], "env": {"A": "b c", "Q": 'say "hi"'}}
    text = table("hosts", host, array=True)
    assert text.startswith("[[hosts]]\nname = \"h1\"\n") and "\n[hosts.env]\n" in text
    two = dumps({"defaults": {"known_hosts": "/k"}}) + "\n" + text + "\n" + table("hosts", {"name": "h2"}, array=True)
    assert tomllib.loads(two) == {"defaults": {"known_hosts": "/k"}, "hosts": [host, {"name": "h2"}]}


def test_odd_names_are_quoted_and_a_table_of_tables_is_still_an_entry() -> None:
    assert table("a b", {"k": 1}, array=True) == '[["a b"]]\nk = 1\n'
    only_tables = table("hosts", {"env": {"A": "1"}}, array=True) + table("hosts", {"env": {"B": "2"}}, array=True)
    assert tomllib.loads(only_tables) == {"hosts": [{"env": {"A": "1"}}, {"env": {"B": "2"}}]}
    assert tomllib.loads(table("server", {"host": "h"})) == {"server": {"host": "h"}}
