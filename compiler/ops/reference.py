"""Reference kernels: a config's argument layout, computed by the naive schedule.

A tuned kernel is checked on the device against a reference kernel run on the same seeded
inputs, and templates lay their arguments out per config (dense packs B in panels of `nr`,
convolutions block their channels), so the reference must take the candidate's layout: the same
argument tensors, in the same order, with the same compute expressions, scheduled by the default
schedule (every stage at root, one serial loop per axis, nothing split, tiled, vectorized,
unrolled or parallel). Whatever is wrong in such a kernel is wrong in the compute definition.

The one liberty taken: a reduction with two or more data axes runs its reduce loops inside the
data axes but outside the last one (`for i, j: for k: for jj: C[i, j, jj] += ...`), so the
innermost loop walks the output's contiguous axis (an NCHW[x]c channel block, a packed panel of
B) instead of striding across a packed weight, which C compilers vectorize without reordering
anything. Every output element still sums its terms in the same order as the default schedule
and the templates' register tiles do; only where the compiler fuses a multiply and an add into an
FMA may differ (it does in such a vectorized loop, as in the tuned kernels' tiles, and may not in
a scalar reduction loop). sgemm 1024 runs about twice as fast as with the reduction innermost.

The reference depends on a config only through its template's `layout_knobs`, so configs that
share a layout share a reference: `reference_symbol` names it by the template, the workload and
those knobs alone, and its generated C is byte-identical for all of them (one content-hash
compile, one artifact on the agent).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from compiler.build import Kernel
from compiler.schedule.schedule import Schedule, create_schedule
from compiler.te.tensor import Tensor

if TYPE_CHECKING:
    from compiler.ops.base import Template

# The prefix of every reference kernel's symbol (a candidate's is "kiln_<op>_...").
REFERENCE_PREFIX = "kiln_ref_"


def naive_schedule(args: Sequence[Tensor]) -> Schedule:
    """The default schedule of `args`' outputs, reductions' reduce loops moved inside all but the
    last data axis (see the module doc)."""
    sch = create_schedule(args[-1])
    for stage in sch.stages:
        if stage.reduce_axis and len(stage.axis) >= 2:
            stage.reorder(*stage.axis[:-1], *stage.reduce_axis, stage.axis[-1])
    return sch


def layout_values(template: Template, config: Mapping[str, Any]) -> dict[str, Any]:
    """The values in `config` of `template`'s layout knobs (none for a template without any)."""
    knobs: Sequence[str] = getattr(template, "layout_knobs", ())
    return {k: config[k] for k in knobs if k in config}


def reference_symbol(template: Template, shape: tuple[int, ...], config: Mapping[str, Any]) -> str:
    """`kiln_ref_<op>_<workload>_<digest of the layout knobs' values>`: equal for configs that
    share a layout, different otherwise (a C identifier)."""
    layout = sorted(layout_values(template, config).items())
    digest = hashlib.sha256(repr(layout).encode()).hexdigest()[:12]
    return f"{REFERENCE_PREFIX}{template.name}_{'x'.join(map(str, shape))}_{digest}"


def reference_kernel(
    template: Template, shape: tuple[int, ...], config: Mapping[str, Any]
) -> Kernel:
    """The reference kernel of `config`'s argument layout, ready for `compiler.build`.

    Templates with a `reference_kernel` method (every template of the library) give its
    schedule; any other `Template` has one layout, its `compute`'s, scheduled naively.
    """
    own = getattr(template, "reference_kernel", None)
    if own is not None:
        sch, args = own(shape, config)
    else:
        args = list(template.compute(shape))
        sch = naive_schedule(args)
    return Kernel(sch, args, reference_symbol(template, shape, config), template.flop(shape))
