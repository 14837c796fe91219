from torch import nn

from alchemetric_ray.models.registry import register_model

RECURRENT_SETTINGS = ("hidden", "layers", "dropout")


class _Recurrent(nn.Module):
    """Sequence windows (batch, window, n_features) -> logits from the last step's state."""

    rnn_cls: type[nn.Module] = nn.LSTM

    def __init__(self, n_features: int, n_classes: int, hidden: int = 64, layers: int = 2, dropout: float = 0.1):
        super().__init__()
        self.rnn = self.rnn_cls(n_features, hidden, num_layers=layers, batch_first=True,
                                dropout=dropout if layers > 1 else 0.0)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, n_classes))

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


# Recurrent layers break under CPU autocast: LSTM fails inside oneDNN, GRU silently stays float32.
@register_model("lstm", inputs="sequence", hyperparameters=RECURRENT_SETTINGS,
                cpu_autocast_broken="LSTM fails under CPU autocast (oneDNN: could not create a primitive descriptor)")
class LSTMClassifier(_Recurrent):
    rnn_cls = nn.LSTM


@register_model("gru", inputs="sequence", hyperparameters=RECURRENT_SETTINGS,
                cpu_autocast_broken="GRU silently stays float32 under CPU autocast, so bf16 would be a false claim")
class GRUClassifier(_Recurrent):
    rnn_cls = nn.GRU
