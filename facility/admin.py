"""Admin for facility settings, budgets and holds: saves go through the services, so the checks are the same."""

from __future__ import annotations

from django import forms
from django.contrib import admin

from facility import services
from facility.models import Budget, FacilitySettings, Hold, Source
from llmgw.errors import LlmgwError


class ServiceForm(forms.ModelForm):
    """Runs the service's checks in clean(), so a refusal shows on the form and nothing is saved."""

    def _check(self, fn) -> None:
        try:
            fn()
        except LlmgwError as exc:
            field = exc.field if exc.field in self.fields else None
            self.add_error(field, exc.message)


class BudgetForm(ServiceForm):
    class Meta:
        model = Budget
        fields = ["domain", "cap_watts", "other_watts"]

    def clean(self):
        data = super().clean()
        if "domain" in data:
            self._check(lambda: data.__setitem__("domain", services.clean_domain(data["domain"])))
        return data


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    form = BudgetForm
    list_display = ["domain", "cap_watts", "other_watts", "source", "updated_at"]
    search_fields = ["domain"]
    list_filter = ["source"]

    def save_model(self, request, obj, form, change):
        services.budget_set(
            domain=obj.domain, cap_watts=obj.cap_watts, other_watts=obj.other_watts, source=Source.ADMIN
        )

    def delete_model(self, request, obj):
        services.budget_delete(domain=obj.domain)

    def delete_queryset(self, request, queryset):
        for obj in queryset:  # "delete selected" goes through the service too
            services.budget_delete(domain=obj.domain)


class HoldForm(ServiceForm):
    class Meta:
        model = Hold
        fields = ["domain", "reason", "drain"]

    def clean(self):
        data = super().clean()
        if "domain" in data:
            self._check(lambda: data.__setitem__("domain", services.clean_domain(data["domain"])))
        return data


@admin.register(Hold)
class HoldAdmin(admin.ModelAdmin):
    form = HoldForm
    list_display = ["domain", "reason", "drain", "created_by", "created_at"]
    search_fields = ["domain", "reason"]

    def save_model(self, request, obj, form, change):
        services.hold_create(
            domain=obj.domain, reason=obj.reason, drain=obj.drain, created_by=request.user.get_username()
        )

    def delete_model(self, request, obj):
        services.hold_release(domain=obj.domain)

    def delete_queryset(self, request, queryset):
        for obj in queryset:  # "delete selected" releases through the service too
            services.hold_release(domain=obj.domain)


@admin.register(FacilitySettings)
class FacilitySettingsAdmin(admin.ModelAdmin):
    list_display = ["margin", "gpu_watts", "cpu_core_watts", "node_watts", "source", "updated_at"]
    fields = ["margin", "gpu_watts", "cpu_core_watts", "node_watts"]

    def has_add_permission(self, request):
        return not FacilitySettings.objects.exists()

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        obj.source = Source.ADMIN
        super().save_model(request, obj, form, change)
        services.facility_changed_send()
