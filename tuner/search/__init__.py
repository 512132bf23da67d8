"""Search: propose configs of a task's space, ask/tell, and learn from measured results.

    base        the Searcher protocol, RandomSearch, SeededSearch (given configs first)
    xgb         XGBSearcher: simulated annealing over an XGBoost cost model (AutoTVM's)
    annealing   the parallel simulated annealing the xgb searcher runs on its model
    cost_model  CostModel.fit/predict on XGBoost with a ranking objective
    features    knob and loop-IR features of a config
    transfer    a model trained on other workloads' records, to pick the first candidates
    factory     searcher_for(task, options, ...), make_searcher(name, task, ...), transfer_scorer

Only `base` and `factory` load with this package; xgboost loads when the xgb searcher is made.
"""

from tuner.search.base import RandomSearch, Searcher, SeededSearch
from tuner.search.factory import (
    TUNERS,
    TransferScore,
    make_searcher,
    searcher_for,
    transfer_scorer,
)

__all__ = [
    "TUNERS",
    "RandomSearch",
    "Searcher",
    "SeededSearch",
    "TransferScore",
    "make_searcher",
    "searcher_for",
    "transfer_scorer",
]
