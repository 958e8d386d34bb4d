"""The facility as the store keeps it: settings, power budgets per domain, holds."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


def _clean_domain_field(obj) -> None:
    """Model.clean() for a `domain` field: the services' check, as a form error on that field."""
    from django.core.exceptions import ValidationError

    from facility.domains import clean_domain
    from llmgw.errors import InvalidInput

    try:
        obj.domain = clean_domain(obj.domain, field="domain")
    except InvalidInput as exc:
        raise ValidationError({"domain": exc.message}) from exc


class Source(models.TextChoices):
    FILE = "file", "server.yaml"
    API = "api", "API or ctl"
    ADMIN = "admin", "admin"
    # A cap derived from the feeds (facility.feed_services): rewritten whenever feeds or labels change,
    # never over a budget somebody wrote.
    FEED = "feed", "feeds"
    NETBOX = "netbox", "NetBox import"


class FacilitySettings(models.Model):
    """The one row of facility-wide figures: margin and the draws assumed when nothing is measured."""

    margin = models.FloatField(
        default=0.1,
        validators=[MinValueValidator(0.0), MaxValueValidator(0.999999)],
        help_text="Share of every cap kept free, in [0, 1).",
    )
    gpu_watts = models.FloatField(
        null=True, blank=True, default=700, validators=[MinValueValidator(0.0)],
        help_text="Draw of a card that reports no power limit (blank: unknown).",
    )
    cpu_core_watts = models.FloatField(
        null=True, blank=True, default=10, validators=[MinValueValidator(0.0)],
        help_text="Draw of a core reserved by a CPU replica (blank: unknown).",
    )
    node_watts = models.FloatField(
        null=True, blank=True, default=350, validators=[MinValueValidator(0.0)],
        help_text="Each node's own draw beyond its cards (blank: unknown).",
    )
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.ADMIN)
    # server.yaml's facility.conditions and facility.sources, as validated (facility.conditions and
    # facility.sources parse them again when read).
    conditions = models.JSONField(default=dict, blank=True)
    sources = models.JSONField(default=dict, blank=True)
    measured_window_seconds = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(60.0), MaxValueValidator(86400.0)],
        help_text="A node's measured draw is its highest reading of this window (blank: LLMGW_MEASURED_WINDOW_SECONDS).",
    )
    # facility.location_from as {level: "agents" | "store"} (facility.domains.parse_location_from); empty:
    # every level from the agents.
    location_from = models.JSONField(default=dict, blank=True)
    # facility.shedding and facility.capping (facility.response parses them again when read).
    shedding = models.JSONField(default=dict, blank=True)
    capping = models.JSONField(default=dict, blank=True)
    # facility.netbox: the NetBox a scheduled sync reads (facility.netbox_sync parses it again when read).
    netbox = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "facility settings"
        verbose_name_plural = "facility settings"

    def __str__(self) -> str:
        return f"margin {self.margin:.0%}"

    @classmethod
    def load(cls) -> FacilitySettings:
        """The settings row, made with the defaults on first use."""
        obj, _ = cls.objects.get_or_create(pk=1)
        return obj


class Budget(models.Model):
    """A domain's power cap: what one feed carries alone, derated. Also the row a placement locks."""

    domain = models.CharField(max_length=300, unique=True, help_text="level:name, e.g. rack:r12-07")
    cap_watts = models.FloatField(validators=[MinValueValidator(0.0)])
    other_watts = models.FloatField(
        default=0, validators=[MinValueValidator(0.0)], help_text="Switches, storage: what llmgw does not see."
    )
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.API)
    derived_from = models.CharField(
        max_length=300, blank=True, help_text="For a cap derived from feeds: which (feed A1 415 V 32 A 3φ 80 %)."
    )
    # A written cap above what the domain's feeds carry: the feeds' cap, which then holds (invariant 11).
    feed_cap_watts = models.FloatField(
        null=True, blank=True, help_text="What the domain's feeds carry, when less than the written cap."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["domain"]

    def __str__(self) -> str:
        return f"{self.domain}: {self.cap_watts / 1000:.1f} kW"

    @property
    def source_text(self) -> str:
        """Where the cap came from, as ctl shows it: the feed, or ``budget``."""
        if self.source == Source.FEED:
            return self.derived_from
        if self.feed_cap_watts is not None:
            return f"{self.derived_from} (the budget's {self.cap_watts / 1000:.1f} kW is above it)"
        return "budget"

    @property
    def effective_cap_watts(self) -> float:
        """The cap placement holds to: the written one, never above what the feeds carry."""
        if self.feed_cap_watts is not None and self.feed_cap_watts < self.cap_watts:
            return self.feed_cap_watts
        return self.cap_watts

    def clean(self) -> None:
        _clean_domain_field(self)


class Hold(models.Model):
    """A domain taken out of placement (maintenance, a known fault); with drain, its replicas move out."""

    domain = models.CharField(max_length=300, unique=True)
    reason = models.CharField(max_length=500)
    drain = models.BooleanField(default=False)
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["domain"]

    def __str__(self) -> str:
        return f"{self.domain} held: {self.reason}"

    def clean(self) -> None:
        _clean_domain_field(self)


class Resolution(models.IntegerChoices):
    """How many minutes one history point covers."""

    MINUTE = 1, "1 minute"
    QUARTER = 15, "15 minutes"


class DomainSample(models.Model):
    """One point of a domain's history: use and reserved (averaged over the point), measured peak, and its
    inlet air (the latest fresh reading at the minute; a quarter's: the highest of its minutes)."""

    domain = models.CharField(max_length=300)
    resolution = models.PositiveSmallIntegerField(choices=Resolution.choices)
    at = models.DateTimeField(help_text="start of the minute or quarter hour the point covers")
    use_watts = models.FloatField()
    reserved_watts = models.FloatField()
    measured_peak_watts = models.FloatField(null=True)
    inlet_celsius = models.FloatField(null=True, help_text="inlet air; null without a fresh reading")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["domain", "resolution", "at"], name="domain_sample_unique")]
        indexes = [models.Index(fields=["resolution", "at"], name="domain_sample_at")]

    def __str__(self) -> str:
        return f"{self.domain} at {self.at:%Y-%m-%d %H:%M} ({self.resolution} min)"


class NodeSample(models.Model):
    """One point of a node's power history (its own use, what is placed, its measured peak)."""

    node_name = models.CharField(max_length=253)
    resolution = models.PositiveSmallIntegerField(choices=Resolution.choices)
    at = models.DateTimeField()
    use_watts = models.FloatField()
    reserved_watts = models.FloatField()
    measured_peak_watts = models.FloatField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node_name", "resolution", "at"], name="node_sample_unique")]
        indexes = [models.Index(fields=["resolution", "at"], name="node_sample_at")]

    def __str__(self) -> str:
        return f"{self.node_name} at {self.at:%Y-%m-%d %H:%M} ({self.resolution} min)"


class Condition(models.TextChoices):
    OK = "ok"
    WARM = "warm"
    HOT = "hot"
    UNKNOWN = "unknown"


class DomainCondition(models.Model):
    """A domain's thermal condition as the last evaluation left it: the evaluator's timers and readings."""

    domain = models.CharField(max_length=300, unique=True)
    condition = models.CharField(max_length=8, choices=Condition.choices, default=Condition.UNKNOWN)
    since = models.DateTimeField(null=True, blank=True)
    reason = models.CharField(max_length=1000, blank=True)
    # facility.conditions.DomainState's *_since timers, epoch seconds or null.
    timers = models.JSONField(default=dict, blank=True)
    # {signal: {"value": float, "at": epoch seconds, "source": name}}: the fresh readings it was judged by.
    readings = models.JSONField(default=dict, blank=True)
    evaluated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["domain"]

    def __str__(self) -> str:
        return f"{self.domain}: {self.condition}"


class ConditionEvent(models.Model):
    """A change of a domain's condition, with the readings that caused it (kept 30 days)."""

    domain = models.CharField(max_length=300, db_index=True)
    before = models.CharField(max_length=8, choices=Condition.choices)
    after = models.CharField(max_length=8, choices=Condition.choices)
    reason = models.CharField(max_length=1000, blank=True)
    readings = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.domain}: {self.before} → {self.after}"


class ConditionOverride(models.Model):
    """A condition set by hand (a known sensor fault), until it is cleared or its time runs out."""

    domain = models.CharField(max_length=300, unique=True)
    condition = models.CharField(max_length=8, choices=Condition.choices)
    reason = models.CharField(max_length=500)
    until = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["domain"]

    def __str__(self) -> str:
        return f"{self.domain} set {self.condition}: {self.reason}"


class SourceStatus(models.Model):
    """Whether a facility source answered at its last poll: a fact shown, never a block."""

    name = models.CharField(max_length=20, unique=True)
    up = models.BooleanField(default=False)
    last_error = models.CharField(max_length=2000, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_poll_at = models.DateTimeField(null=True, blank=True)
    # The last poll's readings (prometheus), kept between polls: {domain: {signal: {value, at, stale_after}}}.
    readings = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name}: {'up' if self.up else 'down'}"


class ScenarioRun(models.Model):
    """The scenario the simulated source replays: its data, when it started and at what speed."""

    name = models.CharField(max_length=100)
    data = models.JSONField()
    started_at = models.DateTimeField()
    speed = models.FloatField(default=1.0)

    def __str__(self) -> str:
        return f"{self.name} from {self.started_at:%Y-%m-%d %H:%M:%S} at ×{self.speed:g}"


class Feed(models.Model):
    """A power feed: a circuit from a panel, held to a share of its rating, supplying PDUs or racks."""

    name = models.CharField(max_length=100, unique=True)
    voltage = models.FloatField(help_text="Volts (line-to-line on three-phase); a DC feed may be negative (-48).")
    amperage = models.FloatField(validators=[MinValueValidator(0.1)])
    phase = models.CharField(max_length=8, choices=[("single", "single-phase"), ("three", "three-phase")])
    supply = models.CharField(max_length=2, choices=[("ac", "AC"), ("dc", "DC")], default="ac")
    status = models.CharField(
        max_length=8,
        choices=[("active", "active"), ("planned", "planned"), ("offline", "offline"), ("failed", "failed")],
        default="active",
        help_text="Only an active feed carries load; a failed one is lost now (N−1).",
    )
    max_utilization = models.FloatField(
        default=0.8, validators=[MinValueValidator(0.01), MaxValueValidator(1.0)],
        help_text="Share of the rating carried continuously (0.8: the 80 % rule).",
    )
    pdus = models.JSONField(default=list, blank=True, help_text="Names of the PDUs it supplies.")
    racks = models.JSONField(default=list, blank=True, help_text="Names of racks it supplies directly.")
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.FILE)
    # The DCIM site the feed was imported from (its slug): an import of one site replaces that site's feeds
    # alone. Blank for feeds written by hand and for a DCIM that names no site.
    site = models.CharField(max_length=100, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"feed {self.name}"


class DcimObject(models.Model):
    """An object a DCIM import brought in, known by the DCIM's own id: the name llmgw gives it follows it.

    A rack renamed in NetBox keeps its id, so the import renames the domain (its budget, hold, conditions
    and history follow) instead of removing one rack and adding another; a name two sites share is told
    apart by the site; a PDU whose input no live feed reaches is recorded as unfed (it carries nothing).
    """

    class Kind(models.TextChoices):
        SITE = "site"
        RACK = "rack"
        FEED = "feed"
        PDU = "pdu"
        DEVICE = "device"

    source = models.CharField(max_length=8, choices=Source.choices, default=Source.NETBOX)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    ext_id = models.BigIntegerField(help_text="The DCIM's id of the object.")
    site = models.CharField(max_length=100, blank=True, default="")
    name = models.CharField(max_length=300, help_text="llmgw's name for it (a domain's, a feed's or a node's).")
    # What the name was made from (the DCIM's own names): a change of these is a rename.
    named_from = models.CharField(max_length=600, blank=True, default="")
    # PDUs: whether a live feed reaches its input (False: it carries nothing).
    fed = models.BooleanField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["kind", "name"]
        constraints = [
            models.UniqueConstraint(fields=["source", "kind", "ext_id"], name="dcim_object_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} ({self.source} #{self.ext_id})"


class DcimSync(models.Model):
    """One site's import as it last ran: what it applied, and what waits for a person's yes."""

    source = models.CharField(max_length=8, choices=Source.choices, default=Source.NETBOX)
    site = models.CharField(max_length=100, blank=True, default="", help_text="blank: every site")
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_applied_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=2000, blank=True, default="")
    # The changes held back for a person (caps that rise or vanish, feeds removed): their lines.
    pending = models.JSONField(default=list, blank=True)
    # Since when the DCIM and llmgw have differed by what waits (null: they agree).
    differs_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["source", "site"]
        constraints = [models.UniqueConstraint(fields=["source", "site"], name="dcim_sync_unique")]

    def __str__(self) -> str:
        return f"{self.source} {self.site or 'every site'}: {len(self.pending)} waiting"


class ImportJob(models.Model):
    """A NetBox import (or sync) run off the request that asked for it: what it was asked, where it is, and
    how it ended. The API answers 202 with its id; ctl and the Facility page read its progress here. The row's
    id is the task's: a task and its record are one thing."""

    class Kind(models.TextChoices):
        IMPORT = "import"
        SYNC = "sync"

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.IMPORT)
    state = models.CharField(max_length=8, choices=State.choices, default=State.QUEUED)
    phase = models.CharField(max_length=200, blank=True, default="queued", help_text="what the job does now")
    url = models.CharField(max_length=1000, blank=True, default="", help_text="the NetBox read")
    site = models.CharField(max_length=100, blank=True, default="", help_text="blank: every site")
    # What the import was asked (roles, row_from, map); the token is kept only until the job reads it.
    options = models.JSONField(default=dict, blank=True)
    token = models.CharField(max_length=1000, blank=True, default="")
    dry_run = models.BooleanField(default=False)
    confirm = models.BooleanField(default=False)
    objects_read = models.PositiveIntegerField(default=0)
    objects_applied = models.PositiveIntegerField(default=0, help_text="changes applied: feeds, labels, caps, renames")
    # The import's diff as it ended (netbox_import's answer), once done.
    result = models.JSONField(null=True, blank=True)
    error = models.CharField(max_length=2000, blank=True, default="")
    error_field = models.CharField(max_length=100, blank=True, default="")
    requested_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"NetBox {self.kind} {self.pk}: {self.state}"

    @property
    def site_or_none(self) -> str | None:
        return self.site or None

    @property
    def error_or_none(self) -> str | None:
        return self.error or None

    @property
    def error_field_or_none(self) -> str | None:
        return self.error_field or None
