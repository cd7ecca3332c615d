"""WgradStore: weight-gradient closures deferred out of the backward pass.

The experts' backward computes the input gradient (dgrad) at once, because the previous layer waits
for it, and pushes a closure that computes the weight gradient (wgrad) here. A schedule runs the
closures later (``run_all``), typically while an all-to-all is in flight, which is where the
overlap comes from (Lancet, DualPipe and Transformer Engine's ``backward_dw`` do the same).

Each closure accumulates into ``param.grad`` exactly like autograd would (set when None, else
in-place add), so a deferred step gives bitwise the same ``.grad`` as an immediate one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def accumulate_grad(param: torch.Tensor, grad: torch.Tensor) -> None:
    """Autograd's leaf accumulation rule: ``.grad = grad`` when unset, else ``.grad += grad``."""
    if param.grad is None:
        param.grad = grad.detach()
    else:
        param.grad.add_(grad)


class WgradStore:
    """FIFO of deferred weight-gradient closures."""

    def __init__(self) -> None:
        self._closures: list[Callable[[], None]] = []

    def defer(self, closure: Callable[[], None]) -> None:
        self._closures.append(closure)

    @property
    def pending(self) -> int:
        return len(self._closures)

    def run_one(self) -> bool:
        """Run the oldest closure; False when none was pending."""
        if not self._closures:
            return False
        closure = self._closures.pop(0)
        with torch.no_grad():
            closure()
        return True

    def run_all(self) -> int:
        """Run every pending closure in the order they were deferred; returns how many ran."""
        ran = 0
        while self.run_one():
            ran += 1
        return ran
