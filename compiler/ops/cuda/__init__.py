"""GPU schedule templates: compute definitions scheduled onto CUDA's grid, with tuning knobs.

Each module holds templates of the `compiler.ops.base.Template` protocol whose schedules bind
loops to `blockIdx.*` / `threadIdx.*` (and `vthread`), so that `compiler.codegen.cuda` renders
them; the builder compiles them with nvcc into `protos.cuda_program` artifacts.
"""
