from torch import nn

from alchemetric_ray.models.registry import register_model


@register_model("mlp", inputs="tabular", hyperparameters=("hidden", "layers", "dropout"))
class MLP(nn.Module):
    """Tabular features (batch, n_features) -> logits (batch, n_classes)."""

    def __init__(self, n_features: int, n_classes: int, hidden: int = 64, layers: int = 2, dropout: float = 0.1):
        super().__init__()
        blocks, width = [], n_features
        for _ in range(layers):
            blocks += [nn.Linear(width, hidden), nn.GELU(), nn.Dropout(dropout)]
            width = hidden
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(width, n_classes)

    def forward(self, x):
        return self.head(self.body(x))
