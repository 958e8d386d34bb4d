"""Admin for models (saved through the apply service, so the checks are the same) and read-only replicas."""

from __future__ import annotations

from django.contrib import admin

from facility.admin import ServiceForm
from llmgw.errors import LlmgwError
from placement import documents, services
from placement.models import Model, Replica, Shard

PROFILE_FIELDS = documents.PROFILE_KEYS


def document_of(data: dict) -> dict:
    """The admin form's fields as the ``kind: Model`` document the service checks."""
    profile = {key: data.get(key) for key in PROFILE_FIELDS if data.get(key) not in (None, "")}
    profile.setdefault("gpus", data.get("gpus") or 0)
    return {"kind": "Model", "name": data.get("name"), "replicas": data.get("replicas"), "profile": profile}


class ModelForm(ServiceForm):
    """A model, checked as the document the API and ctl apply (same words, on the form)."""

    class Meta:
        model = Model
        fields = ["name", "replicas", *PROFILE_FIELDS]

    def service_check(self, data: dict) -> dict:
        documents.model_parse(data=document_of(data))
        return {}


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    form = ModelForm
    list_display = [
        "name",
        "replicas",
        "gpus",
        "nodes",
        "cpu_cores",
        "memory_gib",
        "keep_within",
        "updated_at",
    ]
    search_fields = ["name"]

    def save_model(self, request, obj, form, change):
        try:
            services.model_apply(data=document_of(form.cleaned_data))
        except LlmgwError as exc:  # checked in clean(); a race with another writer lands here
            self.message_user(request, exc.message, level="error")

    def delete_model(self, request, obj):
        services.model_delete(name=obj.name)

    def delete_queryset(self, request, queryset):
        for name in queryset.values_list("name", flat=True):
            services.model_delete(name=name)


class ShardInline(admin.TabularInline):
    model = Shard
    extra = 0
    can_delete = False
    fields = ["node", "gpu_indices", "cpu_cores", "memory_gib", "draw_watts", "state", "port", "restarts"]
    readonly_fields = fields


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    """Replicas are the reconcile's to create and remove: shown here, changed through their model."""

    list_display = ["__str__", "state", "placed_at", "ready_since", "reason"]
    list_filter = ["state", "model"]
    inlines = [ShardInline]
    readonly_fields = [
        "model",
        "ordinal",
        "state",
        "reason",
        "explain",
        "replaces",
        "placed_at",
        "ready_since",
    ]

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
