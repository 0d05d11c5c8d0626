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
        return self.study.ask(self.dists)

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
        """A killed screening left trials asked and never told: ask them again (their points are not lost)."""
        from optuna.trial import TrialState

        self.requeued = int(self.study.user_attrs.get("requeued", 0))
        for t in self.study.trials:
            if t.state == TrialState.RUNNING:
                self.study.enqueue_trial(dict(t.params))
                self.study.tell(t.number, state=TrialState.FAIL)
                self.requeued += 1
        self.study.set_user_attr("requeued", self.requeued)


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
    study = optuna.create_study(study_name=name, storage=f"sqlite:///{db}", directions=["maximize"] * n_objectives,
                                sampler=sampler, load_if_exists=True)  # fmt: skip
    s = Search(study, {k: CategoricalDistribution(v) for k, v in space.items()}, exhaustive, size,
               first_batch=startup, later_batch=max(2, trials // 4), trials=trials)  # fmt: skip
    s.requeue_running()
    return s
