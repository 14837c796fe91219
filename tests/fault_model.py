"""A model with a planted backend fault, as pytorch#193487 behaves: after ``FAULT_AFTER`` training
steps, its first Linear's output is wrong by ``ERROR`` (10 %) on the device, while the shadow
check's float32 CPU copy (whose modules carry ``shadow_reference``) computes it right.

``model.module=fault_model model.name=faulty``; a test sets ``FAULT_AFTER`` (the loop runs in the
test's process in local mode).
"""

from torch import nn

from alchemetric_ray.models import register_model

FAULT_AFTER = 10**9  # training steps before the fault starts (a test lowers it)
ERROR = 0.10


@register_model("faulty", inputs="tabular", hyperparameters=("hidden",))
class Faulty(nn.Module):
    def __init__(self, n_features: int, n_classes: int, hidden: int = 16):
        super().__init__()
        self.first = nn.Linear(n_features, hidden)
        self.rest = nn.Sequential(nn.ReLU(), nn.Linear(hidden, n_classes))
        self.steps = 0  # training forwards so far (one per step)

    def forward(self, x):
        if self.training:
            self.steps += 1
        h = self.first(x)
        if self.steps > FAULT_AFTER and not getattr(self, "shadow_reference", False):
            h = h * (1 + ERROR)
        return self.rest(h)
