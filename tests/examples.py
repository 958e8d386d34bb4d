"""How many examples a property test draws: all of them under `make test`, a third under `make test-quick`
(LLMGW_TEST_QUICK=1), the loop a developer runs every few minutes. CI runs `make test`."""

from __future__ import annotations

import os

QUICK = os.environ.get("LLMGW_TEST_QUICK") == "1"


def examples(count: int) -> int:
    return max(20, count // 3) if QUICK else count
