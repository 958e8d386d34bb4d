"""Admin for nodes, their GPUs and the store's labels; label saves go through the service's checks."""

from __future__ import annotations

from django.contrib import admin
from django.db import transaction

from agents import services
from agents.models import GPU, Node, NodeToken, StoreLabel
from facility import feed_services
from facility.admin import ServiceForm, say_warnings
from llmgw.errors import InvalidInput
from placement import selectors as placement_selectors
from placement import services as placement_services


class GPUInline(admin.TabularInline):
    model = GPU
    extra = 0
    fields = ["index", "uuid", "model", "memory_gib", "power_limit_watts", "present", "booked_by"]
    readonly_fields = fields
    can_delete = False

    @admin.display(description="booked by")
    def booked_by(self, gpu: GPU) -> str:
        return placement_selectors.gpu_bookers(node_id=gpu.node_id).get(gpu.index, "")


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "fabric", "cordoned", "last_heartbeat_at", "cpu_cores", "memory_gib"]
    list_filter = ["cordoned", "fabric"]
    search_fields = ["name", "hostname"]
    fields = [
        "name", "hostname", "fabric", "cordoned", "cordon_reason", "cpu_cores", "memory_gib", "agent_labels",
        "labels", "last_heartbeat_at", "sensors", "sensors_at", "measured_watts", "placed_watts",
    ]
    readonly_fields = [f for f in fields if f not in ("cordoned", "cordon_reason")]
    inlines = [GPUInline]

    def has_add_permission(self, request):
        return False  # nodes join through their agent's heartbeat

    @admin.display(description="placed watts")
    def placed_watts(self, node: Node) -> float:
        return placement_selectors.placed_watts(node_ids=[node.pk]).get(node.pk, 0.0)

    def save_model(self, request, obj, form, change):
        changed = placement_services.cordon_change(node_name=obj.name, cordoned=obj.cordoned, reason=obj.cordon_reason)
        say_warnings(request, changed.warnings)


class StoreLabelForm(ServiceForm):
    """A store label, checked by the service the API and ctl call (same words, on the form)."""

    service_fields = {"node": "node_name", "labels": "value"}

    class Meta:
        model = StoreLabel
        fields = ["node_name", "key", "value"]

    def service_check(self, data: dict) -> dict:
        services.clean_node_name(data.get("node_name"))
        services.labels_check(changes={data.get("key"): data.get("value")})
        other = StoreLabel.objects.filter(node_name=data.get("node_name"), key=data.get("key"))
        if self.instance.pk is not None:
            other = other.exclude(pk=self.instance.pk)
        if other.exists():
            # Saved, it would overwrite that label's value without a word.
            raise InvalidInput(
                f"node {data.get('node_name')} has a label {data.get('key')} already: change that one", field="key"
            )
        return {}


@admin.register(StoreLabel)
class StoreLabelAdmin(admin.ModelAdmin):
    form = StoreLabelForm
    list_display = ["node_name", "key", "value", "set_by", "updated_at"]
    search_fields = ["node_name", "key", "value"]

    def save_model(self, request, obj, form, change):
        changes = {obj.key: obj.value}
        was = (form.initial.get("node_name"), form.initial.get("key")) if change else (None, None)
        with transaction.atomic():
            if was[0] not in (None, obj.node_name):
                # Two nodes in one transaction: every budget first, in the lock order (llmgw.lock_order; one
                # node's row would be held while the other's budgets were waited for).
                feed_services.budgets_locked()
                placement_services.labels_change(node_name=was[0], changes={was[1]: None})
            elif was[1] not in (None, obj.key):
                changes = {was[1]: None, **changes}  # one change of the node: its locks in order
            changed = placement_services.labels_change(
                node_name=obj.node_name, changes=changes, set_by=request.user.get_username()
            )
        say_warnings(request, changed.warnings)

    def delete_model(self, request, obj):
        placement_services.labels_change(node_name=obj.node_name, changes={obj.key: None})

    def delete_queryset(self, request, queryset):
        removed: dict[str, dict[str, None]] = {}
        for node_name, key in queryset.values_list("node_name", "key"):
            removed.setdefault(node_name, {})[key] = None
        with transaction.atomic():
            if len(removed) > 1:
                feed_services.budgets_locked()  # several nodes: every budget first (as save_model)
            for node_name, changes in sorted(removed.items()):
                placement_services.labels_change(node_name=node_name, changes=changes)


@admin.register(NodeToken)
class NodeTokenAdmin(admin.ModelAdmin):
    list_display = ["node_name", "created_at", "last_used_at"]
    fields = ["node_name", "created_at", "last_used_at"]
    readonly_fields = fields

    def has_add_permission(self, request):
        return False  # made with `llmgw ctl node token NODE`, which shows the key once
