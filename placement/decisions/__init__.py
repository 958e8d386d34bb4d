"""The decisions llmgw takes on its own — a drain step, a shedding pick, a capping step — as pure functions.

Plain frozen dataclasses in, the decision out: no Django, no clock (``now`` is an argument), no
database. :mod:`placement.drain`, :mod:`placement.shedding` and :mod:`placement.capping` read the rows,
call these and write what they decide; the unit tests (tests/unit/test_drain_step.py,
test_shed_pick.py, test_cap_step.py) call them alone.
"""
