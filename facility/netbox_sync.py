"""A NetBox sync an operator can leave running: server.yaml's ``facility.netbox`` read on a schedule.

Each run imports as ``llmgw ctl facility import netbox`` does without ``--yes``: what lowers a cap or adds
an object is applied, what would raise or remove one waits for a person (facility.netbox_import), and the
site's DcimSync row keeps what waits and since when NetBox and llmgw have differed — shown by
``ctl facility import status``, the Facility page and ``llmgw_netbox_pending_changes``. A person approves
with ``ctl facility import sync --yes``.

The configuration, checked when the file is applied::

    facility:
      netbox:
        url: https://netbox.example.org     # one of the server's LLMGW_NETBOX_URLS
        token_file: /etc/llmgw/netbox.token
        site: sto1                          # optional: one site
        sync_every: 1h                      # optional: without it, nothing runs on a schedule
        roles: [gpu-server]                 # optional
        row_from: location                  # optional
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from facility.configuration import ConfigError, parse_duration

KEYS = ("url", "token_file", "site", "sync_every", "roles", "row_from")
# A sync more often than this would read all of NetBox again before the last read was applied.
MIN_SYNC_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class NetboxConfig:
    url: str
    token_file: str
    site: str | None = None
    sync_every: float | None = None
    roles: tuple[str, ...] = ()
    row_from: str = "location"


def parse_netbox_config(raw: Any) -> NetboxConfig | None:
    """facility.netbox checked whole (None when absent), or ConfigError naming the key."""
    if raw in (None, {}):
        return None
    if not isinstance(raw, dict):
        raise ConfigError((), "must be a mapping with url and token_file")
    for key in raw:
        if key not in KEYS:
            raise ConfigError((key,), f"unknown key; netbox takes: {', '.join(KEYS)}")
    for key in ("url", "token_file"):
        if not isinstance(raw.get(key), str) or not raw[key].strip() or len(raw[key]) > 1000:
            raise ConfigError((key,), "required: text of at most 1,000 characters")
    site = raw.get("site")
    if site is not None and (not isinstance(site, str) or not site.strip() or len(site) > 100):
        raise ConfigError(("site",), "a site's slug (text of at most 100 characters)")
    every = None
    if raw.get("sync_every") is not None:
        try:
            every = parse_duration(raw["sync_every"])
        except ValueError as exc:
            raise ConfigError(("sync_every",), str(exc)) from None
        if every < MIN_SYNC_SECONDS:
            raise ConfigError(("sync_every",), f"at least {MIN_SYNC_SECONDS:g} s (1m), not {every:g} s")
    roles = raw.get("roles") or []
    if not isinstance(roles, list) or len(roles) > 50 or not all(isinstance(r, str) and 0 < len(r) <= 100 for r in roles):
        raise ConfigError(("roles",), "a list of at most 50 role slugs")
    row_from = raw.get("row_from", "location")
    if row_from not in ("location", "group", "none"):
        raise ConfigError(("row_from",), f"one of location, group, none, not {row_from!r}")
    return NetboxConfig(raw["url"].strip().rstrip("/"), raw["token_file"], site, every, tuple(roles), row_from)


def configured() -> NetboxConfig | None:
    from facility.models import FacilitySettings

    return parse_netbox_config(FacilitySettings.load().netbox or None)


def sync_claim(now) -> bool:
    """Whether the configured sync is due (its interval passed since the site's last run); if so, the run is
    claimed (its time set now), so the next minute's check does not queue it again while it reads NetBox."""
    from django.db import transaction

    from facility.models import DcimSync, Source
    from llmgw.lock_order import rows_locked

    config = configured()
    if config is None or config.sync_every is None:
        return False
    with transaction.atomic():
        row, _ = rows_locked(DcimSync.objects.all()).get_or_create(source=Source.NETBOX, site=config.site or "")
        if row.last_run_at is not None and now - row.last_run_at < timedelta(seconds=config.sync_every):
            return False
        DcimSync.objects.filter(pk=row.pk).update(last_run_at=now)
    return True


def netbox_sync(*, confirm: bool = False, dry_run: bool = False, progress: Any = None) -> dict[str, Any]:
    """Run the configured import now (``confirm``: what waits for a yes too; ``progress``: told where the read
    is, facility.netbox_import.Progress). A NetBox that cannot be read is recorded on the site's row and
    raised (InvalidInput naming the field). Run it as a job (facility.import_jobs), never in a request."""
    from django.conf import settings
    from django.utils import timezone

    from facility.models import DcimSync, Source
    from facility.netbox_import import netbox_api, netbox_import, plan_from_api
    from llmgw.errors import Conflict, InvalidInput

    config = configured()
    if config is None:
        raise Conflict("facility.netbox: no NetBox is configured (server.yaml facility.netbox)", field="netbox")
    try:
        if config.url not in settings.LLMGW_NETBOX_URLS:
            raise InvalidInput(
                f"facility.netbox.url: {config.url} is not one of the server's LLMGW_NETBOX_URLS", field="url")
        try:
            with open(config.token_file, encoding="utf-8") as handle:
                token = handle.read(4096).strip()
        except OSError as exc:
            raise InvalidInput(f"facility.netbox.token_file: {exc.strerror}: {config.token_file}", field="token_file") from None
        plan = plan_from_api(netbox_api(url=config.url, token=token), site=config.site, roles=list(config.roles) or None,
                             row_from=config.row_from, progress=progress)
        if progress is not None:
            progress("computing the diff" if dry_run else "applying")
        return netbox_import(plan=plan, confirm=confirm, dry_run=dry_run)
    except InvalidInput as exc:
        row, _ = DcimSync.objects.get_or_create(source=Source.NETBOX, site=config.site or "")
        row.last_run_at = timezone.now()
        row.last_error = exc.message[:2000]
        row.save(update_fields=["last_run_at", "last_error"])
        raise


def sync_status() -> list[dict[str, Any]]:
    """Each site's import as it last ran: when, what it applied, what waits for a yes and since when."""
    from django.utils import timezone

    from facility.models import DcimSync

    config = configured()
    now = timezone.now()
    out = []
    for row in DcimSync.objects.all():
        out.append({
            "source": row.source,
            "site": row.site or None,
            "last_run_at": row.last_run_at,
            "last_applied_at": row.last_applied_at,
            "last_error": row.last_error or None,
            "pending": list(row.pending),
            "differs_since": row.differs_since,
            "differs_seconds": None if row.differs_since is None else round((now - row.differs_since).total_seconds()),
            "scheduled_every_seconds": config.sync_every if config and (config.site or "") == row.site else None,
        })
    return out


def sync_waiting() -> list[dict[str, Any]]:
    """The sites whose NetBox changes wait for a yes (for the Facility page): how many, the first few, since when."""
    from facility.models import DcimSync

    return [
        {"site": row.site or "every site", "count": len(row.pending), "first": list(row.pending[:3]),
         "since": row.differs_since.timestamp() if row.differs_since else None}
        for row in DcimSync.objects.exclude(pending=[]).order_by("site")
    ]
