"""Admin for nodes, their GPUs and the store's labels; label saves go through the service's checks."""

from __future__ import annotations

from django import forms
from django.contrib import admin

from agents import services
from agents.models import GPU, Node, NodeToken, StoreLabel
from llmgw.errors import LlmgwError


class GPUInline(admin.TabularInline):
    model = GPU
    extra = 0
    fields = ["index", "uuid", "model", "memory_gib", "power_limit_watts", "present", "shard"]
    readonly_fields = fields
    can_delete = False


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

    def save_model(self, request, obj, form, change):
        services.node_cordon(node_name=obj.name, cordoned=obj.cordoned, reason=obj.cordon_reason)


class StoreLabelForm(forms.ModelForm):
    class Meta:
        model = StoreLabel
        fields = ["node_name", "key", "value"]

    def clean(self):
        from facility.domains import DomainError, validate_label

        data = super().clean()
        if "key" in data and "value" in data:
            try:
                services.clean_node_name(data.get("node_name"), field="node_name")
                validate_label(data["key"], data["value"])
            except (DomainError, LlmgwError) as exc:
                self.add_error("value" if isinstance(exc, DomainError) else "node_name", str(exc))
        return data


@admin.register(StoreLabel)
class StoreLabelAdmin(admin.ModelAdmin):
    form = StoreLabelForm
    list_display = ["node_name", "key", "value", "set_by", "updated_at"]
    search_fields = ["node_name", "key", "value"]

    def save_model(self, request, obj, form, change):
        if change and "key" in form.changed_data:
            services.labels_set(node_name=form.initial["node_name"], changes={form.initial["key"]: None})
        services.labels_set(node_name=obj.node_name, changes={obj.key: obj.value}, set_by=request.user.get_username())

    def delete_model(self, request, obj):
        services.labels_set(node_name=obj.node_name, changes={obj.key: None})

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            services.labels_set(node_name=obj.node_name, changes={obj.key: None})


@admin.register(NodeToken)
class NodeTokenAdmin(admin.ModelAdmin):
    list_display = ["node_name", "created_at", "last_used_at"]
    fields = ["node_name", "created_at", "last_used_at"]
    readonly_fields = fields

    def has_add_permission(self, request):
        return False  # made with `llmgw ctl node token NODE`, which shows the key once
