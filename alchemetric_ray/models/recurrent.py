from torch import nn


class _Recurrent(nn.Module):
    """Sequence windows (batch, window, n_features) -> logits from the last step's state."""

    rnn_cls: type[nn.Module] = nn.LSTM

    def __init__(self, n_features: int, n_classes: int, hidden: int = 64, layers: int = 2,
                 dropout: float = 0.1, **_unused):
        super().__init__()
        self.rnn = self.rnn_cls(n_features, hidden, num_layers=layers, batch_first=True,
                                dropout=dropout if layers > 1 else 0.0)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, n_classes))

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class LSTMClassifier(_Recurrent):
    rnn_cls = nn.LSTM


class GRUClassifier(_Recurrent):
    rnn_cls = nn.GRU
