"""Reconcile: every model to its desired replicas — scale, move what drains, place what waits.

Safe to run in several processes at once: scaling locks the model row, and every placement goes
through the guarded commit (:mod:`placement.commit`), so a race costs a replan, never a double booking.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from llmgw.lock_order import rows_locked
from llmgw.sqlin import any_of
from placement import snapshot
from placement.commit import Lane, Placed, collector_paused, lane_rest_mark, lanes_place
from placement.drain import draining_nodes, replicas_drain
from placement.index import PlacementIndex
from placement.models import Model, Replica, ReplicaState, Shard
from placement.reconcile_inputs import ModelInputs, fleet_digest, labels_digest, models_inputs
from placement.services import replicas_free

log = logging.getLogger(__name__)

# Placements one reconcile run inside a request makes at most (the embedded default reconciles in the
# request that asked): a `replicas: 10000` answers at once with the rest pending, which the reconcile
# thread or the next periodic run places.
REQUEST_PLACEMENTS = 100
# How much of a failure's text a model keeps to show (ctl models, the API, the console).
ERROR_MAX_LENGTH = 500


class ModelOverBudget(Exception):
    """A model's reconcile ran past its time budget in this round: it is skipped, the others go on."""

    def __init__(self, model: str, spent: float, budget: float):
        self.model, self.spent, self.budget = model, spent, budget
        super().__init__(
            f"skipped this round: its reconcile took {spent:.1f} s, past its {budget:.1f} s budget"
            " (LLMGW_RECONCILE_MODEL_BUDGET); what waits is tried again in the next round"
        )


@dataclass
class ReconcileRun:
    """One reconcile pass: the time, and one index of the cluster built on first need and kept current.

    ``clock`` measures each model's share of the round (seconds, monotonic); past ``budget`` seconds a
    model is skipped for this round (:class:`ModelOverBudget`) and the others go on.
    """

    now: datetime = field(default_factory=timezone.now)
    placed: int = 0
    pending: int = 0
    removed: int = 0
    created: int = 0
    failed: int = 0
    tried: int = 0
    # At most this many placements tried in this run (None: no bound); `unfinished` once it was reached.
    max_placements: int | None = None
    unfinished: bool = False
    clock: Callable[[], float] = time.monotonic
    budget: float | None = None
    # Seconds each model (by name) took in this round; the models worked on and those passed over.
    spent: dict[str, float] = field(default_factory=dict)
    worked: int = 0
    passed: int = 0
    skipped: int = 0
    _index: PlacementIndex | None = None
    _draining: dict[int, str] | None = None
    # The cluster as read for the models' digests, taken by the index while nothing was written since.
    _views: list | None = None
    _facility: object | None = None

    @property
    def draining(self) -> dict[int, str]:
        """Node id → why it drains, read once per run."""
        if self._draining is None:
            self._draining = draining_nodes()
        return self._draining

    @property
    def index(self) -> PlacementIndex:
        """The cluster's index, built on first need."""
        if self._index is None:
            views, facility = self.cluster()
            self._index = PlacementIndex(views, facility)
            self._views = self._facility = None
        return self._index

    def cluster(self) -> tuple[list, object]:
        """The nodes' and the facility's views, read once until something is written."""
        if self._views is None:
            self._views, self._facility = snapshot.node_views(now=self.now), snapshot.facility_view()
        return self._views, self._facility

    def charge(self, model: str, seconds: float) -> None:
        """Count ``seconds`` of this round to ``model``; past its budget, it is skipped (raises)."""
        spent = self.spent[model] = self.spent.get(model, 0.0) + seconds
        if self.budget is not None and spent > self.budget:
            raise ModelOverBudget(model, spent, self.budget)

    def refresh(self, names: Iterable[str]) -> None:
        """The index takes the named nodes' fresh views (after a free); nothing to do before it is built."""
        if names:
            self._views = self._facility = None
        if self._index is None or not names:
            return
        for view in snapshot.node_views(names=names, now=self.now):
            self._index.update_node(view)

    def counted(self, counts: Placed) -> None:
        """Add what placing some models did to the run's figures."""
        self.tried += counts.tried
        self.placed += counts.placed
        self.pending += counts.pending

    def forget_index(self) -> None:
        """What was planned may not have happened (a failed model): the next need builds the index afresh."""
        self._index = None
        self._views = self._facility = None


class _BudgetedIndex:
    """The run's index, each plan counted to its model's share of the round (ReconcileRun.charge): a model
    whose plans run past its budget raises there, and the placement run marks its lane and goes on with
    the others. Everything else is the index's own."""

    def __init__(self, run: ReconcileRun):
        self._run = run
        self._index = run.index

    def __getattr__(self, name: str):
        return getattr(self._index, name)

    def plan(self, request, *, exclude: frozenset[str] = frozenset()):
        run = self._run
        run.charge(request.model, 0.0)  # already past it (its scaling or drain step): no plan at all
        started = run.clock()
        result = self._index.plan(request, exclude=exclude)
        run.charge(request.model, run.clock() - started)
        return result


def replicas_scale(*, model: Model, run: ReconcileRun) -> None:
    """Create pending replicas up to the desired count, or remove the newest beyond it."""
    freed: set[str] = set()
    with transaction.atomic():
        # The model row serialises scaling: two reconciles never both create ordinal N.
        locked = rows_locked(Model.objects.filter(pk=model.pk)).first()
        if locked is None:
            return
        # A drain's replacement takes the place of the replica it replaces: it is not one more.
        # Their ids only: as instances, a model's thousands of rows would each have its explain
        # decoded, only to be counted.
        replica_ids = list(
            Replica.objects.filter(model=locked, replaces__isnull=True).order_by("ordinal").values_list("pk", flat=True)
        )
        missing = locked.replicas - len(replica_ids)
        if missing > 0:
            last = Replica.objects.filter(model=locked).order_by("-ordinal").values_list("ordinal", flat=True).first()
            start = (last or 0) + 1
            Replica.objects.bulk_create(
                [Replica(model=locked, ordinal=start + i, state=ReplicaState.PENDING) for i in range(missing)]
            )
            run.created += missing
        elif missing < 0:
            # The newest beyond the count, all in one set-based free (one lock of all their nodes).
            doomed = replica_ids[locked.replicas :]
            on = Shard.objects.filter(replica_id__in=any_of(doomed)).order_by()
            freed.update(on.values_list("node__name", flat=True).distinct())
            run.removed += replicas_free(replica_ids=doomed)
    run.refresh(freed)


def replicas_place_pending(*, model: Model, run: ReconcileRun) -> None:
    """Place the model's pending replicas, oldest first, in batches through the guarded commit (a
    failure marks the model with its error, as in reconcile_all)."""
    models_place_pending(models=[model], run=run)


def models_place_pending(*, models: list[Model], run: ReconcileRun) -> set[int]:
    """Place the models' pending replicas, model by model and oldest first, in one run of batches
    through the guarded commit (:func:`placement.commit.lanes_place`). Returns the ids of the models whose placement failed: each
    is marked with its error, and the models after it go on, on an index built afresh."""
    failed: set[int] = set()
    # The models to place, each with the replicas left to try (None: all it has pending).
    todo: list[tuple[Model, set[int] | None]] = [(model, None) for model in models]
    while todo:
        lanes: list[tuple[Model, Lane]] = []
        for model, left in todo:
            try:
                pending = snapshot.pending_replicas(model)
                if left is not None:
                    pending = [replica for replica in pending if replica.pk in left]
                if pending:
                    lanes.append((model, Lane(pending, snapshot.replica_request(model))))
            except Exception as exc:
                _model_failed(model, exc, run)
                failed.add(model.pk)
        if not lanes:
            break
        room = None if run.max_placements is None else max(0, run.max_placements - run.tried)
        try:
            index = _BudgetedIndex(run) if run.budget is not None else run.index
            lanes_place(lanes=[lane for _, lane in lanes], index=index, now=run.now, max_tries=room)
        except Exception as exc:
            # The lane it came from is marked; the index may hold plans its failed batch did not commit:
            # the models not done are read again and go on, on an index built afresh.
            broken = [(model, lane) for model, lane in lanes if lane.error is not None]
            for model, lane in broken or lanes[:1]:
                _model_failed(model, lane.error or exc, run)
                failed.add(model.pk)
                run.counted(lane.counts())  # what it committed before the error stands
            run.forget_index()
            lanes = [(model, lane) for model, lane in lanes if model.pk not in failed]
            # Only what has no outcome yet is tried again (a replica left pending after its lost races
            # has had its tries).
            again = [
                (model, {replica.pk for replica in lane.untried()})
                for model, lane in lanes
                if lane.stopped is None and lane.untried()
            ]
        else:
            again = []
            run.unfinished = run.unfinished or any(lane.cut for _, lane in lanes)
        for model, lane in lanes:
            try:
                counts = lane_rest_mark(lane)
            except Exception as exc:
                _model_failed(model, exc, run)
                failed.add(model.pk)
                continue
            run.counted(counts)
        todo = [(model, left) for model, left in again if model.pk not in failed]
    return failed


def _model_prepare(*, model: Model, run: ReconcileRun) -> None:
    """One model's replicas to its desired count, and one step of its drain (what it makes waits, to be
    placed with the rest)."""
    replicas_scale(model=model, run=run)
    with transaction.atomic():
        # One drain step per model at a time, whichever worker runs it: the model row serialises them
        # (as it does scaling), so two reconciles never make two replacements for one replica.
        if rows_locked(Model.objects.filter(pk=model.pk)).exists():
            replicas_drain(model=model, run=run, draining=run.draining)


@collector_paused()
def reconcile_all(
    *,
    model_names: Iterable[str] | None = None,
    max_placements: int | None = None,
    clock: Callable[[], float] = time.monotonic,
    budget: float | None = -1.0,
) -> ReconcileRun:
    """The models whose inputs moved (or the named ones, in that order, whatever moved) to their desired
    replicas; idempotent.

    A model whose inputs give the digest of its last clean reconcile is passed over
    (:mod:`placement.reconcile_inputs`): nothing it reads moved, so its reconcile would do nothing. The
    others are first scaled and take one drain step, then what waits is placed, model by model, in one run
    of batches. One model whose reconcile fails (a bad row, a database refusal, a bug) or runs past its
    ``budget`` of seconds by ``clock`` (LLMGW_RECONCILE_MODEL_BUDGET; None: no bound) is marked with why
    and the others go on; it is worked on again next round, after the others, and the mark is cleared once
    it reconciles cleanly. At most `max_placements` placements are tried (the run says `unfinished` when
    that stopped it).

    Safe to run in several processes at once: scaling locks the model row, and every placement goes
    through the guarded commit, so a race costs a replan, never a double booking.
    """
    if budget is not None and budget < 0:
        budget = settings.LLMGW_RECONCILE_MODEL_BUDGET_SECONDS or None
    run = ReconcileRun(max_placements=max_placements, clock=clock, budget=budget)
    if model_names is None:
        # Those that failed or were cut last round go after the others: one model's trouble is its own.
        models = sorted(Model.objects.all(), key=lambda m: (bool(m.error), m.name))
    else:
        by_name = {m.name: m for m in Model.objects.filter(name__in=list(model_names))}
        models = [by_name[n] for n in model_names if n in by_name]
    inputs = _inputs(models, run)
    if model_names is None:
        models = [m for m in models if m.pk in inputs and (inputs[m.pk].why or inputs[m.pk].digest != m.reconciled_digest)]
    run.passed = len(inputs) - len(models) if model_names is None else 0
    run.worked = len(models)
    prepared = []
    for model in models:
        started = run.clock()
        try:
            _model_prepare(model=model, run=run)
            run.charge(model.name, run.clock() - started)
        except Exception as exc:
            _model_failed(model, exc, run)
        else:
            prepared.append(model)
    failed = models_place_pending(models=prepared, run=run)
    clean = [model for model in prepared if model.pk not in failed]
    for model in clean:
        if model.error:
            _model_mark(model, "", None)
    if not run.unfinished:
        _digests_keep(clean, inputs)
    return run


def _inputs(models: list[Model], run: ReconcileRun) -> dict[int, ModelInputs]:
    """The models' inputs (placement.reconcile_inputs), the cluster read at most once for them."""
    digests: dict[str, str] = {}

    def cluster(kind: str) -> str:
        if kind not in digests:
            views, facility = run.cluster()
            digests[kind] = fleet_digest(views, facility) if kind == "fleet" else labels_digest(views)
        return digests[kind]

    return models_inputs(
        models, draining=run.draining, fleet=lambda: cluster("fleet"), labels=lambda: cluster("labels"), now=run.now
    )


def _digests_keep(models: list[Model], inputs: dict[int, ModelInputs]) -> None:
    """Keep each model's digest as of this round's start: the next round passes over it while it holds.
    (Taken before the round's own writes, so a model changed by it is worked on once more, and rests then.)"""
    changed = []
    for model in models:
        digest = inputs[model.pk].digest if model.pk in inputs else ""
        if model.reconciled_digest != digest:
            model.reconciled_digest = digest
            changed.append(model)
    if not changed:
        return
    try:
        Model.objects.bulk_update(changed, ["reconciled_digest"], batch_size=500)
    except DatabaseError:  # the next round works on them again: no harm but its time
        log.exception("could not keep the reconciled models' digests")


def _model_failed(model: Model, exc: BaseException, run: ReconcileRun) -> None:
    """One model's failure is its own: a deadlock or race is retried on the next run, a row the database
    refuses (a figure out of range) or a bug stays marked until it places cleanly."""
    if isinstance(exc, ModelOverBudget):
        log.warning("reconcile of model %s: %s; the others go on", model.name, exc)
        run.skipped += 1
        text = str(exc)[:ERROR_MAX_LENGTH]
    else:
        log.error(
            "reconcile of model %s failed; the others go on, it is retried on the next run",
            model.name,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        run.failed += 1
        text = _error_text(exc)
    run.forget_index()  # what it had planned may not have happened: build the index afresh
    _model_mark(model, text, run.now)


def _error_text(exc: BaseException) -> str:
    """The failure in one line: its kind and the first line of what it said."""
    said = str(exc).strip().splitlines()
    return (f"{type(exc).__name__}: {said[0]}" if said else type(exc).__name__)[:ERROR_MAX_LENGTH]


def _model_mark(model: Model, error: str, at: datetime | None) -> None:
    """Keep (or clear) why the model's reconcile failed; a database that refuses even this is logged."""
    try:
        Model.objects.filter(pk=model.pk).update(error=error, error_at=at)
    except DatabaseError:
        log.exception("could not mark model %s with its reconcile error", model.name)
