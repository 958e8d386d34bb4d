"""Models (the LLMs served), their replicas, and the shards that book a node's GPUs, cores and memory."""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models

from placement.topology import ANY, TOPOLOGY_CHOICES


class Model(models.Model):
    """An LLM to serve: how many replicas, and the profile each replica needs."""

    name = models.CharField(max_length=200, unique=True)
    replicas = models.PositiveIntegerField(default=1, help_text="Desired replicas.")
    # The document's `class:` (a Python keyword, hence the name): what shedding moves first (batch).
    service_class = models.CharField(
        max_length=8, default="standard", help_text="critical, standard or batch: batch is shed first"
    )
    min_ready = models.PositiveIntegerField(
        default=1, help_text="Ready replicas no drain, shed or cap takes the model below."
    )
    gpus = models.PositiveIntegerField(default=0, help_text="GPUs per node.")
    nodes = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)], help_text="Nodes per replica.")
    cpu_cores = models.PositiveIntegerField(default=0, help_text="Cores reserved per node.")
    memory_gib = models.FloatField(default=0, validators=[MinValueValidator(0.0)])
    power_watts = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0)], help_text="Declared draw of a replica."
    )
    keep_within = models.CharField(max_length=8, blank=True, help_text="rack, row, room or site")
    node_selector = models.CharField(max_length=2000, blank=True)
    # blank: the admin's form may leave it out, as a document may (the service stores the default).
    topology = models.CharField(
        max_length=10, default=ANY, blank=True, choices=[(c, c) for c in TOPOLOGY_CHOICES],
        help_text="How a shard's GPUs must be joined on its node: any, nvlink-all or same-numa.",
    )
    command = models.CharField(max_length=2000, blank=True)
    health_path = models.CharField(max_length=200, default="/health")
    min_ready_seconds = models.PositiveIntegerField(default=10)
    # Why the last reconcile could not place this model (its other models went on); cleared once it
    # places cleanly.
    error = models.TextField(blank=True, default="", help_text="Why the last reconcile of it failed.")
    error_at = models.DateTimeField(null=True, blank=True)
    # The digest of what its last clean reconcile read (placement.reconcile_inputs): a round passes over
    # the model while its inputs still give this digest. Empty: never reconciled, or since changed.
    reconciled_digest = models.CharField(max_length=32, blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ReplicaState(models.TextChoices):
    PENDING = "pending"  # no node fits yet; `reason` says why
    PLACED = "placed"  # shards booked, the agents not yet running it
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"


class Replica(models.Model):
    """One copy of a model, on one node or several (its shards), or pending with the reason."""

    # No index of its own: the unique (model, ordinal) leads with it. (Likewise below: an index every
    # write keeps up and no read needs.)
    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="replica_set", db_index=False)
    ordinal = models.PositiveIntegerField()
    state = models.CharField(max_length=10, choices=ReplicaState.choices, default=ReplicaState.PENDING)
    reason = models.TextField(blank=True, help_text="Why it is pending, in the pending summary's words.")
    explain = models.JSONField(default=dict, blank=True, help_text="Why it went where it is, and the rejections.")
    replaces = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replaced_by", db_index=False,
        help_text="The replica this one takes over from (a drain).",
    )
    # Set by shedding: the replica is to move off a hot or over-limit domain (the drain's steps move it,
    # replacement first); why, in the shed's words.
    shed_reason = models.CharField(max_length=1000, blank=True, default="")
    placed_at = models.DateTimeField(null=True, blank=True)
    ready_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model", "ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["model", "ordinal"], name="replica_unique_ordinal"),
            # One replacement at a time for a replica being drained.
            models.UniqueConstraint(fields=["replaces"], condition=models.Q(replaces__isnull=False),
                                    name="replica_one_replacement"),
        ]

    def __str__(self) -> str:
        return f"{self.model.name}#{self.ordinal}"


class Shard(models.Model):
    """A replica's share of one node: the GPUs (booked through GpuBooking), cores, memory and draw."""

    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="shards", db_index=False)
    node = models.ForeignKey("agents.Node", on_delete=models.PROTECT, related_name="shards")
    gpu_indices = models.JSONField(default=list)
    cpu_cores = models.PositiveIntegerField(default=0)
    memory_gib = models.FloatField(default=0)
    draw_watts = models.FloatField(null=True, blank=True)
    state = models.CharField(max_length=10, choices=ReplicaState.choices, default=ReplicaState.PLACED)
    port = models.PositiveIntegerField(null=True, blank=True)
    restarts = models.PositiveIntegerField(default=0)
    message = models.CharField(max_length=1000, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["replica", "node"]
        constraints = [
            models.UniqueConstraint(fields=["replica", "node"], name="shard_one_per_node"),
        ]

    def __str__(self) -> str:
        return f"{self.replica} on {self.node.name}"


class GpuBooking(models.Model):
    """One GPU of a node booked by a shard: a card is booked at most once, by the unique constraint.

    On PostgreSQL a booking's (shard, node) is held to its shard's (id, node) — the booking's node is
    its shard's — by statement triggers (migration 0007) rather than a foreign key: the same rule, the
    same error, checked once a statement over all its rows where the key checked each booking at commit
    (a batch of placements books a card a row). So bookings go before their shard, in the statement
    that deletes it or an earlier one, as Django's cascade and ``placement.services`` do.
    """

    shard = models.ForeignKey(Shard, on_delete=models.CASCADE, related_name="gpu_bookings", db_constraint=False)
    node = models.ForeignKey(
        "agents.Node", on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False
    )
    index = models.PositiveIntegerField()

    class Meta:
        ordering = ["node", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_booked_once")]

    def __str__(self) -> str:
        return f"gpu{self.index} of node {self.node_id} for shard {self.shard_id}"


class NodeBooking(models.Model):
    """What a node's shards book in all: kept by the guarded commit and freeing, so room needs no sum.

    A node without a row has nothing booked; the commit makes the row on the node's first shard.
    """

    node = models.OneToOneField("agents.Node", on_delete=models.CASCADE, primary_key=True, related_name="+")
    cpu_cores = models.PositiveIntegerField(default=0)
    memory_gib = models.FloatField(default=0)
    placed_watts = models.FloatField(default=0)

    def __str__(self) -> str:
        return f"booked on node {self.node_id}"


class ShedDomain(models.Model):
    """Shedding's memory of a domain: since when it has been in trouble (hot under enforce, or past its
    power limit) without a break, and when shedding last acted there (one move per interval)."""

    domain = models.CharField(max_length=300, unique=True)
    trouble_since = models.DateTimeField(null=True, blank=True)
    last_move_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.domain


class NodeCap(models.Model):
    """What capping asks of a node's GPUs: a share of their default power limit (or of the top SM clock).

    ``fraction`` is what the heartbeat answer carries (1: the defaults, no block); ``would_fraction``
    is what observe mode would have asked, said and never sent. Kept by placement.capping.
    """

    node = models.OneToOneField("agents.Node", on_delete=models.CASCADE, primary_key=True, related_name="+")
    fraction = models.FloatField(default=1.0)
    would_fraction = models.FloatField(default=1.0)
    reason = models.CharField(max_length=1000, blank=True, default="")
    ok_since = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"node {self.node_id} at {self.fraction:.0%}"


class ModelEfficiency(models.Model):
    """How a model serves on one GPU model, as measured: tokens per second per replica and tokens per joule.

    Kept by placement.throughput from the replicas' reported tokens/s and their GPUs' measured power;
    the planner prefers, among candidates otherwise equal, the GPU model with more tokens per joule.
    """

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="efficiencies", db_index=False)
    gpu_model = models.CharField(max_length=50)
    replicas = models.PositiveIntegerField(default=0, help_text="Replicas measured.")
    tokens_per_second = models.FloatField(help_text="Mean generated tokens per second per replica.")
    watts = models.FloatField(help_text="Mean measured GPU power per replica.")
    tokens_per_joule = models.FloatField()
    measured_at = models.DateTimeField()

    class Meta:
        ordering = ["model", "gpu_model"]
        constraints = [models.UniqueConstraint(fields=["model", "gpu_model"], name="efficiency_one_per_gpu_model")]

    def __str__(self) -> str:
        return f"{self.model} on {self.gpu_model}: {self.tokens_per_joule:.2f} tokens/J"
