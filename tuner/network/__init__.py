"""Tuning a whole network (an ONNX model): its tasks, the task scheduler, running and timing builds.

tune       tune_network: every task of a model within one trial budget; configs_from_records
scheduler  the gradient task scheduler that hands trials to the tasks that cut latency most
run        run a built model on a pool device (outputs and native latency)
timing     time a build and onnxruntime in this process, side by side
"""
