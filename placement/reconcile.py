"""Reconcile: every model to its desired replicas — scale, move what drains, place what waits.

Safe to run in several processes at once: scaling locks the model row, and every placement goes
through the guarded commit (:mod:`placement.commit`), so a race costs a replan, never a double booking.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.db import DatabaseError, transaction
from django.utils import timezone

from llmgw.sqlin import any_of
from placement import snapshot
from placement.commit import Lane, Placed, collector_paused, lane_rest_mark, lanes_place
from placement.drain import draining_nodes, replicas_drain
from placement.index import PlacementIndex
from placement.models import Model, Replica, ReplicaState, Shard
from placement.services import replicas_free

log = logging.getLogger(__name__)

# Placements one reconcile run inside a request makes at most (the embedded default reconciles in the
# request that asked): a `replicas: 10000` answers at once with the rest pending, which the reconcile
# thread or the next periodic run places.
REQUEST_PLACEMENTS = 100
# How much of a failure's text a model keeps to show (ctl models, the API, the console).
ERROR_MAX_LENGTH = 500


@dataclass
class ReconcileRun:
    """One reconcile pass: the time, and one index of the cluster built on first need and kept current."""

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
    _index: PlacementIndex | None = None
    _draining: dict[int, str] | None = None

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
            self._index = PlacementIndex(snapshot.node_views(now=self.now), snapshot.facility_view())
        return self._index

    def refresh(self, names: Iterable[str]) -> None:
        """The index takes the named nodes' fresh views (after a free); nothing to do before it is built."""
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


def replicas_scale(*, model: Model, run: ReconcileRun) -> None:
    """Create pending replicas up to the desired count, or remove the newest beyond it."""
    freed: set[str] = set()
    with transaction.atomic():
        # The model row serialises scaling: two reconciles never both create ordinal N.
        locked = Model.objects.select_for_update().filter(pk=model.pk).first()
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
    through the guarded commit (:func:`placement.commit.lanes_place`: the next model's first batch is
    planned while the last one's commits). Returns the ids of the models whose placement failed: each
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
            lanes_place(lanes=[lane for _, lane in lanes], index=run.index, now=run.now, max_tries=room)
        except Exception as exc:
            # The lane it came from is marked; what was planned on top of its batches may not have
            # happened: the models not done are read again and go on, on an index built afresh.
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
        if Model.objects.select_for_update().filter(pk=model.pk).exists():
            replicas_drain(model=model, run=run, draining=run.draining)


@collector_paused()
def reconcile_all(*, model_names: Iterable[str] | None = None, max_placements: int | None = None) -> ReconcileRun:
    """Every model (or the named ones, in that order) to its desired replicas; idempotent.

    First every model is scaled and takes one drain step, then what waits is placed, model by model,
    in one run of batches. One model whose reconcile fails (a bad row, a database refusal, a bug) is
    marked with its error and the others go on; the mark is cleared once it reconciles cleanly. At
    most `max_placements` placements are tried (the run says `unfinished` when that stopped it).

    Safe to run in several processes at once: scaling locks the model row, and every placement goes
    through the guarded commit, so a race costs a replan, never a double booking.
    """
    run = ReconcileRun(max_placements=max_placements)
    if model_names is None:
        models = list(Model.objects.order_by("name"))
    else:
        by_name = {m.name: m for m in Model.objects.filter(name__in=list(model_names))}
        models = [by_name[n] for n in model_names if n in by_name]
    prepared = []
    for model in models:
        try:
            _model_prepare(model=model, run=run)
        except Exception as exc:
            _model_failed(model, exc, run)
        else:
            prepared.append(model)
    failed = models_place_pending(models=prepared, run=run)
    for model in prepared:
        if model.error and model.pk not in failed:
            _model_mark(model, "", None)
    return run


def _model_failed(model: Model, exc: BaseException, run: ReconcileRun) -> None:
    """One model's failure is its own: a deadlock or race is retried on the next run, a row the database
    refuses (a figure out of range) or a bug stays marked until it places cleanly."""
    log.error(
        "reconcile of model %s failed; the others go on, it is retried on the next run",
        model.name,
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    run.failed += 1
    run.forget_index()  # what it had planned may not have happened: build the index afresh
    _model_mark(model, _error_text(exc), run.now)


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
