"""A NetBox import job in the one line ctl and the Facility page print."""

from __future__ import annotations

import pytest

from facility.import_progress import job_progress_text


@pytest.mark.parametrize(("job", "text"), [
    ({"id": 7, "kind": "import", "state": "queued", "phase": "queued"}, "NetBox import 7 queued"),
    ({"id": 7, "kind": "sync", "state": "running", "phase": "reading NetBox: power-feeds", "objects_read": 1250},
     "NetBox sync 7 running: reading NetBox: power-feeds, 1,250 objects read"),
    ({"id": 7, "kind": "import", "state": "done", "dry_run": True, "objects_read": 125},
     "NetBox import 7 (dry run) done, 125 objects read: nothing written"),
    ({"id": 7, "kind": "import", "state": "done", "objects_read": 125, "objects_applied": 1},
     "NetBox import 7 done, 125 objects read, 1 change applied"),
    ({"id": 7, "kind": "import", "state": "failed", "error": "--url: NetBox at http://nb refused the token (403)"},
     "NetBox import 7 failed: --url: NetBox at http://nb refused the token (403)"),
])
def test_a_job_in_one_line(job, text):
    assert job_progress_text(job) == text
