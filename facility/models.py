"""The facility as the store keeps it: settings, power budgets per domain, holds."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


def _clean_domain_field(obj) -> None:
    """Model.clean() for a `domain` field: the services' check, as a form error on that field."""
    from django.core.exceptions import ValidationError

    from facility.services import clean_domain
    from llmgw.errors import InvalidInput

    try:
        obj.domain = clean_domain(obj.domain, field="domain")
    except InvalidInput as exc:
        raise ValidationError({"domain": exc.message}) from exc


class Source(models.TextChoices):
    FILE = "file", "server.yaml"
    API = "api", "API or ctl"
    ADMIN = "admin", "admin"


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
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["domain"]

    def __str__(self) -> str:
        return f"{self.domain}: {self.cap_watts / 1000:.1f} kW"

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
    """One point of a domain's power history: use and reserved (averaged over the point), measured peak."""

    domain = models.CharField(max_length=300)
    resolution = models.PositiveSmallIntegerField(choices=Resolution.choices)
    at = models.DateTimeField(help_text="start of the minute or quarter hour the point covers")
    use_watts = models.FloatField()
    reserved_watts = models.FloatField()
    measured_peak_watts = models.FloatField(null=True)

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
