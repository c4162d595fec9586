"""What an optimizer wrapper (AsyncOptimizer, LocalSGD) passes through to
the optimizer it wraps, ``self.optimizer``: its parameter groups, state and
zero_grad, so schedulers and training loops see an optimizer."""

from typing import Any, Dict, List

import torch


class OptimizerWrapper:
    optimizer: torch.optim.Optimizer

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
