"""The tuner: search schedule spaces, measure candidates on a device pool, keep the records.

Rooms, each with one job:

    task      Task: one workload of one op template, its config space and FLOP count
    search/   searchers (random, XGBoost-guided annealing), cost model, features, transfer
    measure/  builders, runners, the tracker client, the local pool
    records/  tuning records, one store interface, file and Redis stores, `open_store`
    loop      the tuning loop of one task (`tune`), with `TuneOptions` and callbacks
    network/  tuning a whole network: tasks, task scheduler, run and timing of builds

The `kiln` package above it is the front door (CLI and Python API); nothing here imports it.
"""
