"""`tuner.peer.interleaved_matmul_seconds`: a built dense kernel and numpy's matmul timed in one
child process, after the kernel's output is checked against numpy's. No assertion on speed."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil

import pytest

from compiler import toolchain
from compiler.artifact import Artifact, Entry
from compiler.ops.base import OpTemplate
from tuner import peer
from tuner.measure.builder import build_one
from tuner.records import Workload
from tuner.task import Task

pytestmark = [
    pytest.mark.usefixtures("build_cache"),
    pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc"),
]

SHAPE = (64, 64, 64)
WORKLOAD = Workload("dense", SHAPE)
ROUNDS, MIN_ROUND_S = 3, 0.002  # short rounds: nothing here is about speed


def built(**layout: object) -> tuple[Artifact, dict[str, object]]:
    """The artifact and knobs of a plausible dense 64^3 config with the `layout` knobs."""
    task = Task(WORKLOAD)
    template = task.template
    assert isinstance(template, OpTemplate)
    for index in range(len(task.space)):
        config = task.space.get(index)
        if all(config[k] == v for k, v in layout.items()) and template.worth_measuring(
            SHAPE, config
        ):
            result = build_one(WORKLOAD, index, "host")
            assert result.artifact is not None, result.error
            return result.artifact, dict(config)
    raise AssertionError(f"no plausible config with {layout}")


def test_times_ours_and_numpy_for_every_round_on_one_core() -> None:
    artifact, knobs = built(nr=16)
    core = min(os.sched_getaffinity(0))
    found = peer.interleaved_matmul_seconds(
        artifact, "dense", SHAPE, knobs, ROUNDS, MIN_ROUND_S, core=core
    )
    assert found.rounds == 3 and len(found.ours_s) == len(found.numpy_s) == 3
    assert all(s > 0 for s in (*found.ours_s, *found.numpy_s))
    assert found.core == core
    assert found.max_error <= 1e-4
    assert found.ratio > 0


def test_refuses_a_config_whose_packing_does_not_match_the_kernel() -> None:
    artifact, knobs = built(nr=16)
    with pytest.raises(peer.KernelMismatch, match=r"input 1 \(B_packed\).*packing gives"):
        peer.interleaved_matmul_seconds(
            artifact, "dense", SHAPE, {**knobs, "nr": 32}, ROUNDS, MIN_ROUND_S
        )


# Kernels with the arguments of dense 64^3 at nr=16, kc=64 (A [64][64], B packed [4][64][16],
# C [64][4][16]) that are wrong: one drops the last k of the sum (a missing tail), one fails.
WRONG = r"""
#include <stdint.h>
int32_t missing_tail(void **args) {
  const float *a = args[0], *b = args[1];
  float *c = args[2];
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 64; ++j) {
      float s = 0.0f;
      for (int k = 0; k < 63; ++k) s += a[i * 64 + k] * b[(j / 16) * 64 * 16 + k * 16 + j % 16];
      c[i * 64 + j] = s;
    }
  return 0;
}
int32_t fails(void **args) { (void)args; return 7; }
int32_t never_returns(void **args) { (void)args; for (volatile int x = 0;; ++x) {} return 0; }
"""


def wrong_artifact(symbol: str, like: Artifact) -> Artifact:
    """`symbol` of WRONG, with the argument specs of `like`'s kernel."""
    data = toolchain.compile_shared(WRONG).data
    own = like.entries[0]
    entry = dataclasses.replace(own, symbol=symbol, timing_symbol=f"{symbol}__time")
    assert isinstance(entry, Entry)
    return Artifact(data, hashlib.sha256(data).hexdigest(), "shared_object", like.target, (entry,))


@pytest.mark.parametrize(
    ("symbol", "why"),
    [
        ("missing_tail", "before timing: the kernel's output differs from numpy's: output 0 max"),
        ("fails", "before timing: the kernel returned error code 7"),
    ],
)
def test_refuses_a_wrong_kernel_before_timing(symbol: str, why: str) -> None:
    artifact, knobs = built(nr=16, kc=64)
    wrong = wrong_artifact(symbol, artifact)
    with pytest.raises(peer.KernelMismatch, match=why):
        peer.interleaved_matmul_seconds(wrong, "dense", SHAPE, knobs, ROUNDS, MIN_ROUND_S)


def test_a_kernel_that_never_returns_is_killed_at_the_timeout() -> None:
    artifact, knobs = built(nr=16, kc=64)
    wrong = wrong_artifact("never_returns", artifact)
    with pytest.raises(RuntimeError, match=r"did not finish within 3 s"):
        peer.interleaved_matmul_seconds(
            wrong, "dense", SHAPE, knobs, ROUNDS, MIN_ROUND_S, timeout_s=3.0
        )
