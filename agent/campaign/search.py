"""The search strategy of a screening: Optuna's ask/tell over a backlog item's space.

A space that fits the trial budget is searched exhaustively by Optuna's GridSampler (every point asked once,
in one batch); a larger one by multivariate TPE with a constant liar (batches of candidates asked before any is
told).  The study (``<state>/optuna.db``) is the sampler's memory only: what a candidate measured is kinv.db's
(the screened table), and the campaign tells the study the values it reads from there."""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

from kinv.agent import faults
from kinv.agent.errors import StateDamaged


@contextlib.contextmanager
def quiet_experimental():
    """Optuna marks multivariate TPE and constant_liar experimental; said once in the docs, not per run."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*experimental feature.*")
        yield


def _grid_sampler(space: dict[str, list], seed: int):
    import optuna

    class AskTellGrid(optuna.samplers.GridSampler):
        """GridSampler stops ``Study.optimize`` when the grid is spent; under ask/tell the campaign's trial
        budget ends the search, and ``Study.stop`` outside ``optimize`` would raise."""

        def after_trial(self, study, trial, state, values) -> None:
            return None

    return AskTellGrid(space, seed=seed)


@dataclass
class Search:
    """One screening's ask/tell loop state: the study, its distributions and its batch sizes."""

    study: object
    dists: dict
    exhaustive: bool
    size: int
    first_batch: int
    later_batch: int
    trials: int
    requeued: int = 0

    @property
    def label(self) -> str:
        return "grid (exhaustive)" if self.exhaustive else "TPE (multivariate)"

    @property
    def budget(self) -> int:
        """Trials to finish: the space (exhaustive) or the trial budget, plus every trial asked again after a kill
        (a re-asked trial does not use up the budget)."""
        return (self.size if self.exhaustive else self.trials) + self.requeued

    @property
    def n_objectives(self) -> int:
        return len(self.study.directions)

    def finished(self) -> int:
        return len([t for t in self.study.get_trials(deepcopy=False) if t.state.is_finished()])

    def batch(self, first: bool) -> int:
        return min(self.first_batch if first else self.later_batch, self.budget - self.finished())

    def ask(self):
        """A new trial and its point: created first (a kill there leaves it with none of its parameters), then
        given each parameter, as ``Study.ask(distributions)`` does."""
        t = self.study.ask()
        faults.point("search.trial-created")
        for name, dist in self.dists.items():
            t.suggest_categorical(name, dist.choices)
        return t

    def tell(self, trial, values: list[float]) -> None:
        self.study.tell(trial, values)

    def prune(self, trial) -> None:
        from optuna.trial import TrialState

        self.study.tell(trial, state=TrialState.PRUNED)

    def fail(self, trial) -> None:
        from optuna.trial import TrialState

        self.study.tell(trial, state=TrialState.FAIL)

    def is_told(self, number: int) -> bool:
        from optuna.trial import TrialState

        return any(t.number == number and t.state != TrialState.RUNNING for t in self.study.get_trials(deepcopy=False))

    def requeue_running(self) -> None:
        """A killed screening left trials asked and never told: ask them again (their points are not lost).  A
        trial cut before all its parameters were set is completed from its grid point when the grid had chosen
        one, else dropped (the sampler asks a fresh point in its place); a queued trial whose parameters are
        incomplete (an earlier start's) is dropped the same way.  No dropped trial uses up the budget."""
        from optuna.trial import TrialState

        self.requeued = int(self.study.user_attrs.get("requeued", 0))
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
            point = self._point(t)
            if t.state == TrialState.WAITING:
                if point is None:  # an earlier start queued a point that cannot be asked: never pop it
                    self.study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
                    self.requeued += 1
                continue
            if point is not None:
                self.study.enqueue_trial(point)
            self.study.tell(t.number, state=TrialState.FAIL)
            self.requeued += 1
        self.study.set_user_attr("requeued", self.requeued)

    def _point(self, t) -> dict | None:
        """The whole point a trial was asked at (its parameters, or those it was queued with, or its grid point),
        or None when the kill came before it had one."""
        params = {**(t.system_attrs.get("fixed_params") or {}), **t.params}
        if set(self.dists) <= set(params):
            return {k: params[k] for k in self.dists}
        grid = self.study.sampler
        gid = t.system_attrs.get("grid_id")
        if self.exhaustive and gid is not None and t.system_attrs.get("search_space") == grid._search_space:
            return dict(zip(grid._param_names, grid._all_grids[gid]))
        return None


def open_search(db: Path, name: str, space: dict[str, list], trials: int, seed: int, n_objectives: int) -> Search:
    """The search of one screening (created, or loaded to resume): a grid when the space has at most ``trials``
    points, TPE otherwise."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    size = math.prod(len(v) for v in space.values())
    exhaustive = size <= trials
    startup = size if exhaustive else max(2, trials // 2)
    with quiet_experimental():
        sampler = (_grid_sampler(space, seed) if exhaustive else
                   optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                              n_startup_trials=startup))  # fmt: skip
    try:
        study = optuna.create_study(study_name=name, storage=f"sqlite:///{db}", sampler=sampler, load_if_exists=True,
                                    directions=["maximize"] * n_objectives)  # fmt: skip
        s = Search(study, {k: CategoricalDistribution(v) for k, v in space.items()}, exhaustive, size,
                   first_batch=startup, later_batch=max(2, trials // 4), trials=trials)  # fmt: skip
        s.requeue_running()
    except Exception as exc:  # noqa: BLE001 - any failure to load the sampler's memory is the same damage
        raise StateDamaged(study_damaged(db, name, exc)) from None
    return s


def study_damaged(db: Path, name: str, exc: BaseException | str) -> str:
    """One line: the study cannot be loaded, why, and the way back (kinv.db keeps every measured candidate)."""
    why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return (f"the campaign's search {name} in {db} cannot be loaded ({why}): move it aside (mv {db} {db}.damaged) "
            "and run the campaign again; kinv.db keeps what every screened candidate measured, so none is timed "
            "again")
