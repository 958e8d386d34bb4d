"""The reference pages written from the code: every command a user types has its --help there."""

from __future__ import annotations

import re

from llmgw import docgen
from llmgw.cli import USAGE


def test_the_cli_reference_has_every_command_of_llmgws_usage_that_llmgw_owns():
    page = docgen.cli_page()
    sections = re.findall(r"^## `(.+)`$", page, re.M)
    for command in ("demo", "serve", "ctl", "sim", "agent"):
        assert f"llmgw {command}" in sections, command
        assert re.search(rf"^  {command}\b", USAGE, re.M), command
    assert {"llmgw sim up", "llmgw sim facility", "llmgw ctl explain-placement"} <= set(sections)
    # Each section is the command's own help: its usage line names it.
    facility = page[page.index("## `llmgw sim facility`") :]
    assert facility.split("\n")[3].startswith("usage: llmgw sim facility [-h] [-f FILE] [--speed SPEED] [scenario]")
