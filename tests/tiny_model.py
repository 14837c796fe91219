"""A model that lives outside the package: ``model.module=tiny_model model.name=tiny``.

Importing this module registers the model, on the driver and in every Ray worker (conftest puts
tests/ on the workers' PYTHONPATH); nothing in alchemetric_ray names it.
"""

from torch import nn

from alchemetric_ray.models import register_model


@register_model("tiny", inputs="tabular", hyperparameters=("hidden",))
class Tiny(nn.Module):
    """One hidden layer: tabular features (batch, n_features) -> logits (batch, n_classes)."""

    def __init__(self, n_features: int, n_classes: int, hidden: int = 8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))

    def forward(self, x):
        return self.net(x)
