"""The API's bodies for the facility (domains, holds, budgets), as serializers: what /api/v1/schema says.

Kept in one module: the facility API's schema (/api/v1/schema) is read from these, and the bodies
share their field bounds (domains, watts, reasons) with one another.
"""

from __future__ import annotations

import math

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from facility.domains import LEVELS, MAX_VALUE_LENGTH
from facility.services import WATTS_MAX
from llmgw.api import CountedDictField, CountedListField, NumberField, TextField, WordsField


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, naming them: a misspelt `drian` must not be silently dropped."""

    def validate(self, attrs):
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError(
                {unknown[0]: [f"unknown field; this takes {', '.join(self.fields)}"]}
            )
        return attrs


# What facility.domains.parse_domain takes, for the schema (the service checks and words the refusal).
DOMAIN_PATTERN = rf"^({'|'.join(LEVELS)}):[A-Za-z0-9._-]{{1,{MAX_VALUE_LENGTH}}}$"
DOMAIN_OR_EMPTY_PATTERN = rf"^(({'|'.join(LEVELS)}):[A-Za-z0-9._-]{{1,{MAX_VALUE_LENGTH}}})?$"


def strict_request_bodies(result, generator, request, public):
    """drf-spectacular postprocessing hook: the request bodies of StrictSerializers take no other keys."""
    for cls in StrictSerializer.__subclasses__():
        name = cls.__name__.removesuffix("Serializer") + "Request"
        component = result.get("components", {}).get("schemas", {}).get(name)
        if component is not None:
            component["additionalProperties"] = False
    return result


@extend_schema_field({"type": "string", "pattern": DOMAIN_PATTERN, "example": "rack:r12-07"})
class DomainField(TextField):
    """A `level:name` domain: the schema states its form, the service checks it (one set of words)."""


class StrictBooleanField(serializers.BooleanField):
    """true or false only: 0, 1 or "yes" are refused, as the schema says."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class WattsField(NumberField):
    """Watts in [0, WATTS_MAX]: the schema states the bounds, the service checks them (one set of words)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # Set after __init__ so DRF adds no validator of its own: the service refuses, naming the field.
        self.min_value = 0
        self.max_value = WATTS_MAX


class UtilizationField(NumberField):
    """NetBox's max utilization, a percent in [1, 100]: the schema states the bounds, the import checks
    them (facility.feeds.utilization_problem: the words ctl gives, with what to write for a fraction)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.min_value = 1
        self.max_value = 100


class DrainProgressSerializer(serializers.Serializer):
    left = serializers.IntegerField()
    moving = serializers.IntegerField()
    blocked = serializers.ListField(child=serializers.DictField(), help_text="[{replica, reason}]")


class DomainHoldSerializer(serializers.Serializer):
    reason = serializers.CharField()
    drain = serializers.BooleanField()
    created_by = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    drain_progress = DrainProgressSerializer(allow_null=True)
    drain_text = serializers.CharField(allow_null=True)


CONDITIONS = ("ok", "warm", "hot", "unknown")


class InletEnteringSerializer(serializers.Serializer):
    to = serializers.ChoiceField(choices=["warm", "hot"], help_text="the condition it enters if it stays")
    edge_c = serializers.FloatField(help_text="the edge it stands above")
    since = serializers.FloatField(help_text="since when (seconds since the epoch)")
    after = serializers.CharField(help_text="how long it must stay above to enter (\"1 min\")")


class InletSerializer(serializers.Serializer):
    celsius = serializers.FloatField(help_text="the latest inlet reading")
    at = serializers.FloatField(help_text="when it was read (seconds since the epoch)")
    source = serializers.CharField(allow_blank=True, help_text="the source that gave it: agents, prometheus, …")
    warm_c = serializers.FloatField(help_text="warm above this")
    hot_c = serializers.FloatField(help_text="hot above this")
    above_since = serializers.FloatField(
        allow_null=True, help_text="warm or hot: since when it has stood above that edge (seconds since the epoch)"
    )
    entering = InletEnteringSerializer(
        allow_null=True, required=False,
        help_text="the worse condition the inlet is on its way to, while above that edge for less than the entry time",
    )


class ConditionStateSerializer(serializers.Serializer):
    condition = serializers.ChoiceField(choices=CONDITIONS)
    mode = serializers.ChoiceField(choices=("observe", "enforce"), allow_null=True)
    detail = serializers.CharField(allow_blank=True, help_text="the reading in words")
    overridden = serializers.BooleanField(help_text="set by hand")
    readings = serializers.DictField(child=serializers.FloatField(), help_text="signal → latest value")
    age_seconds = serializers.FloatField(allow_null=True, help_text="age of the oldest of those readings")
    inlet = InletSerializer(allow_null=True, help_text="the latest inlet reading with its thresholds")
    judged_at = serializers.FloatField(
        allow_null=True, required=False, help_text="when the condition was last judged (seconds since the epoch)"
    )
    stale = serializers.BooleanField(
        required=False,
        help_text="judged longer ago than three rounds of the evaluation (at least 2 min): it has stopped, "
        "the condition is not today's",
    )


class SourceStatusSerializer(serializers.Serializer):
    name = serializers.CharField()
    up = serializers.BooleanField()
    last_error = serializers.CharField(allow_blank=True)
    last_success_at = serializers.DateTimeField(allow_null=True)
    last_poll_at = serializers.DateTimeField(allow_null=True)


# "from" is a Python keyword, so this serializer is made with type() rather than a class statement.
ConditionEventSerializer = type(
    "ConditionEventSerializer",
    (serializers.Serializer,),
    {
        "__doc__": "A change of a domain's condition and the readings that caused it.",
        "domain": serializers.CharField(),
        "from": serializers.ChoiceField(choices=CONDITIONS),
        "to": serializers.ChoiceField(choices=CONDITIONS),
        "reason": serializers.CharField(allow_blank=True),
        "readings": serializers.DictField(child=serializers.FloatField()),
        "at": serializers.DateTimeField(),
    },
)


class ConditionOverrideSerializer(StrictSerializer):
    domain = DomainField(max_length=300, help_text="level:name, e.g. rack:r12-07")
    condition = serializers.ChoiceField(choices=CONDITIONS)
    reason = WordsField(max_length=500)
    for_seconds = NumberField(
        required=False, allow_null=True, default=None, min_value=1, max_value=366 * 86_400,
        help_text="how long (seconds); not given: until cleared",
    )


class ConditionOverrideBodySerializer(serializers.Serializer):
    domain = serializers.CharField()
    condition = serializers.ChoiceField(choices=CONDITIONS)
    reason = serializers.CharField()
    until = serializers.DateTimeField(allow_null=True)
    created_by = serializers.CharField(allow_blank=True)


class RolledUpSerializer(serializers.Serializer):
    condition = serializers.ChoiceField(choices=["ok", "warm", "hot", "unknown"])
    from_ = serializers.CharField(help_text="the rack that gives it: `rack r1-01`")

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = fields.pop("from_")
        return fields


class DomainRowSerializer(serializers.Serializer):
    domain = serializers.CharField(help_text="level:name")
    level = serializers.ChoiceField(choices=LEVELS)
    name = serializers.CharField()
    nodes = serializers.ListField(child=serializers.CharField())
    use_watts = serializers.FloatField()
    reserved_watts = serializers.FloatField()
    measured_watts = serializers.FloatField(allow_null=True)
    cap_watts = serializers.FloatField(allow_null=True)
    cap_source = serializers.CharField(
        allow_null=True, help_text="where the cap came from: `budget`, or the feed (`feed A1 415 V 32 A 3φ 80 %`)"
    )
    cap_warning = serializers.CharField(
        allow_null=True, help_text="a written cap above its feeds': `budget 8.0 kW is above feed B2's 2.9 kW`"
    )
    limit_watts = serializers.FloatField(allow_null=True)
    other_watts = serializers.FloatField(allow_null=True)
    over_limit = serializers.BooleanField()
    condition = ConditionStateSerializer()
    rolled_up = RolledUpSerializer(
        allow_null=True,
        help_text="a row's, room's or site's: its worst rack's condition where that is worse than its own",
    )
    hold = DomainHoldSerializer(allow_null=True)


class FacilitySettingsSerializer(serializers.Serializer):
    margin = serializers.FloatField()
    gpu_watts = serializers.FloatField(allow_null=True)
    cpu_core_watts = serializers.FloatField(allow_null=True)
    node_watts = serializers.FloatField(allow_null=True)
    measured_window_seconds = serializers.FloatField(help_text="the window of the measured peak")


class FacilitySerializer(serializers.Serializer):
    settings = FacilitySettingsSerializer()
    domains = DomainRowSerializer(many=True)
    node_drains = serializers.DictField(child=DrainProgressSerializer(), help_text="node name → its drain")
    sources = SourceStatusSerializer(many=True, help_text="each facility source's last poll")


class HoldSerializer(StrictSerializer):
    domain = DomainField(max_length=300, help_text="level:name, e.g. rack:r12-07, or a bare name one known domain has")
    reason = WordsField(max_length=500)
    drain = StrictBooleanField(required=False, allow_null=True, default=None,
                                     help_text="not given: as it was (false for a new hold)")
    new = StrictBooleanField(required=False, default=False, help_text=(
        "true: hold a domain nothing knows yet (no node, feed, budget or DCIM import names it), ahead of"
        " its nodes; without it such a domain is refused as a likely typo"))


class HoldBodySerializer(serializers.Serializer):
    domain = serializers.CharField()
    reason = serializers.CharField()
    drain = serializers.BooleanField()
    created_by = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    warning = serializers.CharField(
        allow_null=True, help_text=(
            "set when no node is in the domain yet (a typo?), with the nearest known names; with drain, each"
            " domain the drain's dry run takes past its limit (with the figures) and each replica that cannot move"
        ),
    )


class BudgetSerializer(StrictSerializer):
    domain = DomainField(max_length=300)
    cap_watts = WattsField()
    other_watts = WattsField(required=False, allow_null=True, default=None,
                             help_text="not given: as it was (0 for a new budget)")


class BudgetRemovedSerializer(serializers.Serializer):
    domain = serializers.CharField()
    warning = serializers.CharField(
        allow_null=True, help_text="no cap is left on the domain (none derived from its feeds): nothing limits its power"
    )


class BudgetBodySerializer(serializers.Serializer):
    domain = serializers.CharField()
    cap_watts = serializers.FloatField()
    other_watts = serializers.FloatField()
    warning = serializers.CharField(
        allow_null=True, required=False, help_text="a domain no node is in (a typo?), a cap above what the domain's feeds carry (theirs holds), "
        "or a use already past the new limit"
    )


class GivenFloatField(serializers.FloatField):
    """A float query parameter: given empty (`?hours=`), it is refused as no number, not taken as absent."""

    def get_value(self, dictionary):
        if self.field_name in dictionary and dictionary.get(self.field_name) == "":
            return ""
        return super().get_value(dictionary)


class HistoryQuerySerializer(StrictSerializer):
    hours = GivenFloatField(
        required=False, default=48, min_value=0.1, max_value=720,
        help_text="how far back: up to 48 h in 1-minute points, up to 720 h (30 days) in 15-minute points",
    )

    def validate_hours(self, value: float) -> float:
        if not math.isfinite(value):
            raise serializers.ValidationError("a number of hours in [0.1, 720]")
        return value


class HistoryPointSerializer(serializers.Serializer):
    at = serializers.DateTimeField(help_text="start of the minute or quarter hour the point covers")
    use_watts = serializers.FloatField(help_text="use, averaged over the point")
    reserved_watts = serializers.FloatField(help_text="reserved, averaged over the point")
    measured_peak_watts = serializers.FloatField(allow_null=True, help_text="the highest fresh measurement")
    inlet_celsius = serializers.FloatField(
        allow_null=True, required=False,
        help_text="a domain's inlet air: its fresh reading at the minute, the highest of a quarter's (null: none)",
    )


class DomainHistorySerializer(serializers.Serializer):
    domain = serializers.CharField()
    hours = serializers.FloatField()
    resolution_minutes = serializers.IntegerField(help_text="1 or 15")
    points = HistoryPointSerializer(many=True)


class FeedLegSerializer(serializers.Serializer):
    leg = serializers.ChoiceField(choices=["A", "B", "C"])
    domain = serializers.CharField(help_text="leg:<pdu>.<leg>")
    use_watts = serializers.FloatField(help_text="its nodes' use, as every domain's")
    cap_watts = serializers.FloatField(allow_null=True, help_text="V_LL / √3 × A × max_utilization")
    limit_watts = serializers.FloatField(allow_null=True)


class FeedPduLegsSerializer(serializers.Serializer):
    pdu = serializers.CharField()
    legs = FeedLegSerializer(many=True)
    imbalance = serializers.FloatField(
        allow_null=True, help_text="the busiest or idlest leg's distance from the legs' mean, as a share of it"
    )


class FeedRowSerializer(serializers.Serializer):
    name = serializers.CharField()
    voltage = serializers.FloatField(help_text="a DC feed's may be negative (-48)")
    amperage = serializers.FloatField()
    phase = serializers.ChoiceField(choices=["single", "three"])
    supply = serializers.ChoiceField(choices=["ac", "dc"])
    status = serializers.ChoiceField(
        choices=["active", "planned", "offline", "failed"], help_text="only an active feed carries load"
    )
    max_utilization = serializers.FloatField()
    capacity_watts = serializers.FloatField(help_text="|V| × A × max_utilization (× √3 three-phase)")
    text = serializers.CharField(help_text="feed A1 415 V 32 A 3φ 80 %")
    pdus = serializers.ListField(child=serializers.CharField())
    racks = serializers.ListField(child=serializers.CharField(), help_text="named, or reached through its PDUs")
    load_watts = serializers.FloatField(help_text="its nodes' use (node_watts + larger of placed and measured)")
    reserved_watts = serializers.FloatField()
    measured_watts = serializers.FloatField()
    legs = FeedPduLegsSerializer(many=True, help_text="its three-phase PDUs' legs, where outlets' legs are known")


class UnfedPduSerializer(serializers.Serializer):
    pdu = serializers.CharField()
    racks = serializers.ListField(child=serializers.CharField())
    nodes = serializers.ListField(child=serializers.CharField(), help_text="nodes on it: they run on their other PDU alone")
    text = serializers.CharField()


class FeedsSerializer(serializers.Serializer):
    feeds = FeedRowSerializer(many=True)
    unfed_pdus = UnfedPduSerializer(many=True, help_text="PDUs a NetBox import found no live feed reaching: they carry nothing")


class ViolationSerializer(serializers.Serializer):
    feed_lost = serializers.CharField()
    domain = serializers.CharField(allow_null=True, help_text="the rack, PDU or leg; null for a feed's own total")
    carrier = serializers.CharField(help_text="the surviving feed (or PDU) that would carry it")
    reserved_watts = serializers.FloatField()
    measured_watts = serializers.FloatField()
    load_watts = serializers.FloatField()
    capacity_watts = serializers.FloatField()
    over_watts = serializers.FloatField(allow_null=True)
    dark_nodes = serializers.ListField(child=serializers.CharField(), help_text="nodes left with no feed")
    text = serializers.CharField()


class CarriedSerializer(serializers.Serializer):
    feed = serializers.CharField()
    load_watts = serializers.FloatField(help_text="its load once the other feed is lost")
    capacity_watts = serializers.FloatField()


class FeedLossItemSerializer(serializers.Serializer):
    feed = serializers.CharField(help_text="the feed lost")
    status = serializers.ChoiceField(choices=["active", "planned", "offline", "failed"])
    failed = serializers.BooleanField(help_text="lost already: its violations are the present")
    violations = ViolationSerializer(many=True)
    carried = CarriedSerializer(many=True, help_text="what each feed left would carry, the fullest first")


class FeedLossSerializer(serializers.Serializer):
    feeds = FeedLossItemSerializer(many=True)
    violations = serializers.IntegerField(help_text="0 is the state to keep")
    text = serializers.CharField()


# A what-if's target: a domain to hold (level:name), or a feed to lose (a feed's name has no ':').
WHAT_IF_TARGET_PATTERN = rf"^((({'|'.join(LEVELS)}):[A-Za-z0-9._-]{{1,{MAX_VALUE_LENGTH}}})|[A-Za-z0-9._-]{{1,100}})$"


@extend_schema_field({"type": "string", "pattern": WHAT_IF_TARGET_PATTERN, "example": "rack:r12-07"})
class WhatIfTargetField(TextField):
    """A domain to hold or a feed to lose: the schema states the form, the service checks it."""


class WhatIfSerializer(StrictSerializer):
    target = WhatIfTargetField(
        max_length=300, help_text="a domain to hold (rack:r12-07), or the name of a feed to lose (A1)"
    )
    drain = StrictBooleanField(required=False, default=False, help_text="with a hold: move its replicas out")


class WhatIfMoveSerializer(serializers.Serializer):
    replica = serializers.CharField(help_text="model#ordinal")
    model = serializers.CharField()
    to = serializers.ListField(child=serializers.CharField())
    why = serializers.CharField()

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = serializers.ListField(child=serializers.CharField())
        return fields


class WhatIfBlockedSerializer(serializers.Serializer):
    replica = serializers.CharField()
    model = serializers.CharField()
    reason = serializers.CharField()

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = serializers.ListField(child=serializers.CharField())
        return fields


class WhatIfStaySerializer(serializers.Serializer):
    replica = serializers.CharField()
    model = serializers.CharField()
    on = serializers.ListField(child=serializers.CharField())


class WhatIfDomainSerializer(serializers.Serializer):
    domain = serializers.CharField()
    use_watts_before = serializers.FloatField()
    use_watts_after = serializers.FloatField()
    limit_watts = serializers.FloatField()


class WhatIfResultSerializer(serializers.Serializer):
    scenario = serializers.CharField()
    nodes = serializers.ListField(child=serializers.CharField(), help_text="the nodes that leave")
    moves = WhatIfMoveSerializer(many=True)
    blocked = WhatIfBlockedSerializer(many=True)
    stay = WhatIfStaySerializer(many=True)
    domains = WhatIfDomainSerializer(
        many=True,
        help_text="the budgeted domains whose use it changes, and those past their limit after (the rows "
        "`llmgw ctl facility what-if` prints); every other domain stays as it is",
    )
    feed_loss = ViolationSerializer(many=True)
    feed_carried = CarriedSerializer(many=True, help_text="a feed's loss: what each feed left would carry")
    warnings = serializers.ListField(
        child=serializers.CharField(),
        help_text="a hold's: what holding the domain would warn of (no node is in it; with drain, a domain "
        "taken past its limit, a replica that cannot move); none for a feed's loss",
    )


# A file sent whole to be applied or imported (server.yaml, models.yaml, NetBox's CSV): at most this many
# characters, inside the request's own limit (LLMGW_REQUEST_MAX_BYTES); a name at most MAX_FILENAME.
MAX_FILE_CHARS = 1_000_000
MAX_FILENAME = 1000
MAX_FILES = 8


class FacilityApplySerializer(StrictSerializer):
    text = TextField(max_length=MAX_FILE_CHARS, allow_blank=True, help_text="the server.yaml, whole")
    filename = TextField(
        max_length=MAX_FILENAME, required=False, default="server.yaml",
        help_text="named in refusals: `FILENAME line N: facility.margin: …`",
    )
    files = CountedDictField(
        child=TextField(max_length=MAX_FILE_CHARS, allow_blank=True), required=False, default=dict,
        max_items=MAX_FILES, items="files",
        help_text="the files it names, by the name it gives (facility.sources.simulated.file: the scenario); "
        "nothing is read from the server's disk",
    )
    confirm = StrictBooleanField(
        required=False, default=False,
        help_text="true: apply it even though it removes budgets or feeds an earlier file set; without it such a "
        "file is refused with 409 (field: confirm) naming every one, and nothing is applied",
    )

    def validate_files(self, value: dict) -> dict:
        for name in value:
            if not 0 < len(name) <= MAX_FILENAME:
                raise serializers.ValidationError(f"a file's name is 1 to {MAX_FILENAME} characters")
        return value


class FeedsAppliedSerializer(serializers.Serializer):
    created = serializers.IntegerField()
    updated = serializers.IntegerField()
    unchanged = serializers.IntegerField(help_text="named as they were: nothing written")
    removed = serializers.ListField(child=serializers.CharField(), help_text="the feeds removed, by name")


class FacilityAppliedSerializer(serializers.Serializer):
    created = serializers.IntegerField(help_text="budgets created")
    updated = serializers.IntegerField(help_text="budgets updated")
    unchanged = serializers.IntegerField(help_text="budgets named as they were: nothing written")
    removed = serializers.IntegerField(help_text="budgets removed (an earlier file's, no longer named)")
    removed_domains = serializers.ListField(child=serializers.CharField())
    feeds = FeedsAppliedSerializer(required=False, help_text="only when the file has feeds:")
    warnings = serializers.ListField(
        child=serializers.CharField(), help_text="budgets above what their feeds carry (the feeds' cap holds)"
    )


class NetboxImportSerializer(StrictSerializer):
    """Either NetBox's CSV export of power feeds, or a NetBox the server may read (LLMGW_NETBOX_URLS)."""

    csv = TextField(
        max_length=MAX_FILE_CHARS, required=False, allow_blank=True,
        help_text="NetBox's CSV export of power feeds (offline sites); each feeds its rack",
    )
    url = TextField(
        max_length=MAX_FILENAME, required=False,
        help_text="NetBox's address, one of the server's LLMGW_NETBOX_URLS (none unless its admins set some)",
    )
    token = TextField(max_length=MAX_FILENAME, required=False, help_text="NetBox's API token (with url)")
    site = TextField(max_length=100, required=False, allow_null=True, default=None,
                     help_text="only this site's slug (with url)")
    dry_run = StrictBooleanField(required=False, default=False, help_text="compute the diff; write nothing")
    confirm = StrictBooleanField(
        required=False, default=False,
        help_text="apply what waits for a yes too: caps that rise or vanish, feeds removed, nodes taken out of a "
        "rack or PDU (without it they are held back and listed; the rest is applied)",
    )
    roles = CountedListField(
        child=TextField(max_length=100), required=False, default=list, max_length=50,
        help_text="label devices of these role slugs as nodes (default: the roles of devices known as nodes)",
    )
    map = CountedListField(
        child=TextField(max_length=400), required=False, default=list, max_length=1000,
        help_text="SITE/DEVICE=NODE: which node a device is whose name two sites share (got1/gpu01=gpu01-got1)",
    )
    row_from = serializers.ChoiceField(
        choices=["location", "group", "none"], required=False, default="location",
        help_text="a rack's row: its nested location, its rack group, or none",
    )
    default_utilization = UtilizationField(
        required=False, allow_null=True, default=None,
        help_text="with csv: the max utilization (%) of feeds whose export has no such column",
    )

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if ("csv" in attrs) == ("url" in attrs):
            raise serializers.ValidationError({"csv": ["give csv (NetBox's CSV export) or url, one of them"]})
        if "url" in attrs and "token" not in attrs:
            raise serializers.ValidationError({"token": ["required with url (NetBox's API token)"]})
        for key in ("token", "site"):
            if "csv" in attrs and attrs.get(key) is not None:
                raise serializers.ValidationError({key: ["only with url: a CSV import reads no NetBox"]})
        for key in ("roles", "map"):
            if "csv" in attrs and attrs.get(key):
                raise serializers.ValidationError({key: ["only with url: a CSV export of feeds names no device"]})
        if "url" in attrs and attrs.get("default_utilization") is not None:
            raise serializers.ValidationError({"default_utilization": ["only with csv: the API gives every feed's"]})
        return attrs


class NetboxFeedTextSerializer(serializers.Serializer):
    text = serializers.CharField(help_text="feed A1 415 V 32 A 3φ 80 %")
    pdus = serializers.ListField(child=serializers.CharField())
    racks = serializers.ListField(child=serializers.CharField())
    status = serializers.ChoiceField(choices=["active", "planned", "offline", "failed"])


class NetboxCapChangeSerializer(serializers.Serializer):
    domain = serializers.CharField()
    from_watts = serializers.FloatField(allow_null=True, help_text="null: no cap before")
    to_watts = serializers.FloatField(allow_null=True, help_text="null: no cap any more")
    text = serializers.CharField(help_text="rack R-B02: no cap any more (was 5.9 kW)")


class NetboxFeedSerializer(NetboxFeedTextSerializer):
    name = serializers.CharField()


class NetboxFeedChangeSerializer(serializers.Serializer):
    name = serializers.CharField()
    to = NetboxFeedTextSerializer()

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = NetboxFeedTextSerializer()
        return fields


class NetboxRenameSerializer(serializers.Serializer):
    to = serializers.CharField()

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = serializers.CharField()
        return fields


class NetboxImportedSerializer(serializers.Serializer):
    first = serializers.ListField(
        child=serializers.CharField(),
        help_text="what to read first: caps falling below the use now, what waits for a yes, renames, devices two "
        "sites share, PDUs no feed reaches",
    )
    needs_yes = serializers.ListField(
        child=serializers.CharField(), help_text="caps that rise or vanish, feeds removed, nodes leaving a domain"
    )
    held_back = serializers.ListField(
        child=serializers.CharField(), help_text="of needs_yes, what was not applied (no confirm)"
    )
    feeds_added = NetboxFeedSerializer(many=True)
    feeds_changed = NetboxFeedChangeSerializer(many=True)
    feeds_renamed = NetboxRenameSerializer(many=True, help_text="the same NetBox feed under another name")
    renamed = NetboxRenameSerializer(
        many=True, help_text="domains NetBox renamed (rack:R-B01 -> rack:R-B01-NEW): budget, hold, history follow"
    )
    ambiguous = serializers.ListField(
        child=serializers.CharField(), help_text="devices named alike in two sites: no label set until mapped (map)"
    )
    unfed_pdus = serializers.ListField(child=serializers.CharField(), help_text="PDUs no live feed reaches")
    feeds_removed = serializers.ListField(child=serializers.CharField(), help_text="the import's own, no longer listed")
    labels = serializers.DictField(
        child=serializers.DictField(child=serializers.CharField(allow_null=True)),
        help_text="node → its location labels that change (null: removed, NetBox no longer gives it)",
    )
    caps = NetboxCapChangeSerializer(many=True, help_text="every cap the feeds give that changes or disappears")
    labels_kept = serializers.ListField(
        child=serializers.CharField(), help_text="an operator's label kept where NetBox says otherwise"
    )
    skipped = serializers.ListField(child=serializers.CharField(), help_text="NetBox objects not taken, and why")
    notes = serializers.ListField(child=serializers.CharField(), help_text="planned, offline and failed feeds")
    applied = serializers.BooleanField(help_text="false: a dry run, or nothing could be applied without a yes")
    dry_run = serializers.BooleanField()


class NetboxSyncStatusSerializer(serializers.Serializer):
    source = serializers.CharField()
    site = serializers.CharField(allow_null=True, help_text="null: every site")
    last_run_at = serializers.DateTimeField(allow_null=True)
    last_applied_at = serializers.DateTimeField(allow_null=True)
    last_error = serializers.CharField(allow_null=True)
    pending = serializers.ListField(child=serializers.CharField(), help_text="what waits for a yes")
    differs_since = serializers.DateTimeField(allow_null=True, help_text="since when something has waited")
    differs_seconds = serializers.IntegerField(allow_null=True)
    scheduled_every_seconds = serializers.FloatField(allow_null=True, help_text="facility.netbox.sync_every")


@extend_schema_field(NetboxImportedSerializer)
class ImportResultField(serializers.JSONField):
    """The import's diff as the import answered it, whole (the parts the schema names, and any it adds)."""


class ImportJobSerializer(serializers.Serializer):
    """A NetBox import or sync run as a job (facility.import_jobs): where it is, and how it ended."""

    id = serializers.IntegerField(help_text="GET /api/v1/facility/import/jobs/{id} reads it")
    kind = serializers.CharField(help_text="import (a NetBox named in the request) or sync (server.yaml's)")
    state = serializers.ChoiceField(choices=["queued", "running", "done", "failed"])
    phase = serializers.CharField(help_text="what it does now: reading NetBox: ENDPOINT, planning, applying, …")
    url = serializers.CharField(help_text="the NetBox read (blank for a sync: server.yaml's)")
    site = serializers.CharField(allow_null=True, source="site_or_none", help_text="null: every site")
    dry_run = serializers.BooleanField()
    confirm = serializers.BooleanField()
    objects_read = serializers.IntegerField(help_text="NetBox objects read so far")
    objects_applied = serializers.IntegerField(help_text="changes applied: feeds, labels, caps, renames")
    error = serializers.CharField(allow_null=True, source="error_or_none", help_text="why it failed (state failed)")
    error_field = serializers.CharField(allow_null=True, source="error_field_or_none",
                                        help_text="the request's field the failure names (url, site, token_file …)")
    requested_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    result = ImportResultField(allow_null=True, help_text="the import's diff, once done (as a CSV import answers)")


class NetboxSyncBodySerializer(StrictSerializer):
    confirm = StrictBooleanField(required=False, default=False, help_text="apply what waits for a yes too")
    dry_run = StrictBooleanField(required=False, default=False, help_text="compute the diff; write nothing")
