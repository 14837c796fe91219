import torch
from torch import nn

from alchemetric_ray.errors import UserError
from alchemetric_ray.models.registry import register_model


@register_model("transformer", inputs="sequence", hyperparameters=("hidden", "layers", "dropout", "heads", "window"))
class TransformerClassifier(nn.Module):
    """A small pre-norm Transformer encoder over (batch, window, n_features); learned positions."""

    def __init__(self, n_features: int, n_classes: int, hidden: int = 64, layers: int = 2,  # noqa: PLR0913 (its hyperparameters)
                 dropout: float = 0.1, heads: int = 4, window: int = 20):
        super().__init__()
        if hidden % heads:
            raise UserError(f"model.hidden ({hidden}) must be divisible by model.heads ({heads}) for the transformer")
        self.embed = nn.Linear(n_features, hidden)
        self.position = nn.Parameter(torch.zeros(1, window, hidden))
        layer = nn.TransformerEncoderLayer(hidden, heads, dim_feedforward=2 * hidden, dropout=dropout,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x):
        h = self.embed(x) + self.position[:, -x.shape[1]:]
        h = self.encoder(h)
        return self.head(self.norm(h[:, -1]))
