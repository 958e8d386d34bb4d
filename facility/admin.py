"""Admin for facility settings, budgets and holds: saves go through the services, so the checks are the same."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.forms.models import construct_instance

from facility import services
from facility.models import Budget, FacilitySettings, Hold, Source
from llmgw.errors import LlmgwError
from placement import services as placement_services


def say_warnings(request, warnings: list[str]) -> None:
    """A use case's warnings on the admin's next page, as the API's ``warning`` and ctl's lines say them."""
    for warning in warnings:
        messages.warning(request, warning)


class ServiceForm(forms.ModelForm):
    """Runs the service's check in clean(), so a refusal shows on the form in the service's words (the
    API's and ctl's) and nothing is saved; the model's own validators are not run, so no second wording."""

    # The service's name of a field (its first part) → the form's, where they differ.
    service_fields: dict[str, str] = {}

    def service_check(self, data: dict) -> dict:
        """The service's checked values for the form's data; raises LlmgwError naming the field."""
        raise NotImplementedError

    def form_field(self, field: str | None) -> str | None:
        """The form field a refusal of the service's ``field`` shows on (None: on the form)."""
        if not field or field in self.fields:
            return field
        head, _, _ = field.partition(".")
        mapped = self.service_fields.get(head, field.rpartition(".")[2])
        return mapped if mapped in self.fields else None

    def clean(self):
        data = super().clean()
        if self.errors:  # a field the form could not read (not a number): the form says so already
            return data
        try:
            data.update(self.service_check(data))
        except LlmgwError as exc:
            self.add_error(self.form_field(exc.field), exc.message)
        return data

    def _post_clean(self):
        # Build the instance and check uniqueness, without the model's validators: the service's check
        # in clean() is the one set of words.
        try:
            self.instance = construct_instance(self, self.instance, self._meta.fields, self._meta.exclude)
        except ValueError as exc:
            self.add_error(None, str(exc))
        self.validate_unique()


class KeyedForm(ServiceForm):
    """A row the service keys by its domain: on a change the domain is read-only (the admin would save the
    row under the new domain through the service, and leave the old one: both racks held or budgeted),
    so its checks take the row's own."""

    def domain(self, data: dict) -> object:
        return data.get("domain") if "domain" in self.fields else self.instance.domain


class KeyedAdmin(admin.ModelAdmin):
    """Its rows' domain is set when a row is added, never changed: remove the row and add another."""

    def get_readonly_fields(self, request, obj=None):
        return ("domain",) if obj is not None else ()


class BudgetForm(KeyedForm):
    class Meta:
        model = Budget
        fields = ["domain", "cap_watts", "other_watts"]

    def service_check(self, data: dict) -> dict:
        return services.budget_check(
            domain=self.domain(data), cap_watts=data.get("cap_watts"), other_watts=data.get("other_watts")
        )


@admin.register(Budget)
class BudgetAdmin(KeyedAdmin):
    form = BudgetForm
    list_display = ["domain", "cap_watts", "other_watts", "source", "updated_at"]
    search_fields = ["domain"]
    list_filter = ["source"]

    def save_model(self, request, obj, form, change):
        changed = placement_services.budget_change(
            domain=obj.domain, cap_watts=obj.cap_watts, other_watts=obj.other_watts, source=Source.ADMIN
        )
        say_warnings(request, changed.warnings)
        obj.pk = changed.value.pk  # the admin's next page links the row the service wrote

    def delete_model(self, request, obj):
        say_warnings(request, placement_services.budget_remove(domain=obj.domain).warnings)

    def delete_queryset(self, request, queryset):
        for obj in queryset:  # "delete selected" goes through the service too
            say_warnings(request, placement_services.budget_remove(domain=obj.domain).warnings)


class HoldForm(KeyedForm):
    class Meta:
        model = Hold
        fields = ["domain", "reason", "drain"]

    def service_check(self, data: dict) -> dict:
        return services.hold_check(domain=self.domain(data), reason=data.get("reason"))


@admin.register(Hold)
class HoldAdmin(KeyedAdmin):
    form = HoldForm
    list_display = ["domain", "reason", "drain", "created_by", "created_at"]
    search_fields = ["domain", "reason"]

    def save_model(self, request, obj, form, change):
        created = placement_services.hold_create(
            domain=obj.domain, reason=obj.reason, drain=obj.drain, created_by=request.user.get_username()
        )
        say_warnings(request, created.warnings)
        obj.pk = created.hold.pk

    def delete_model(self, request, obj):
        placement_services.hold_release(domain=obj.domain)

    def delete_queryset(self, request, queryset):
        for obj in queryset:  # "delete selected" releases through the service too
            placement_services.hold_release(domain=obj.domain)


class FacilitySettingsForm(ServiceForm):
    class Meta:
        model = FacilitySettings
        fields = ["margin", "gpu_watts", "cpu_core_watts", "node_watts"]

    def service_check(self, data: dict) -> dict:
        return services.settings_check(**{key: data.get(key) for key in self._meta.fields})


@admin.register(FacilitySettings)
class FacilitySettingsAdmin(admin.ModelAdmin):
    form = FacilitySettingsForm
    list_display = ["margin", "gpu_watts", "cpu_core_watts", "node_watts", "source", "updated_at"]
    fields = ["margin", "gpu_watts", "cpu_core_watts", "node_watts"]

    def has_add_permission(self, request):
        return not FacilitySettings.objects.exists()

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        services.settings_set(
            margin=obj.margin, gpu_watts=obj.gpu_watts, cpu_core_watts=obj.cpu_core_watts,
            node_watts=obj.node_watts, source=Source.ADMIN,
        )
