"""kiln-tracker: the device registry, lease broker and wait queue of a Kiln pool.

Layers, outermost first (each imports only the ones below it):

    __main__   CLI: flags, logging, signals, ready file
    server     create_server(): gRPC server + DevicePool + Reaper
    service    thin gRPC servicer: proto -> serde -> pool -> serde -> proto
    serde      the only module that imports *_pb2
    pool       DevicePool: validation, Acquire wait queue, dispatch, reasons
    reaper     task on the event loop that expires agents and leases
    waitqueue  pending Acquire requests, priority then FIFO
    store/     TrackerStore contract (base) and implementations (memory, redis + its Lua scripts)
    model, config, errors, tokens   plain records shared by all of the above

The server, the pool, the store and the reaper share one asyncio event loop: store calls are
coroutines (redis.asyncio for Redis), so no call waits for a thread.
"""
