from torch import nn

from alchemetric_ray.models.registry import register_model


class _CausalBlock(nn.Module):
    def __init__(self, channels_in: int, channels_out: int, kernel_size: int, dilation: int, dropout: float):
        super().__init__()
        self.pad = (kernel_size - 1) * dilation
        self.conv1 = nn.Conv1d(channels_in, channels_out, kernel_size, dilation=dilation)
        self.conv2 = nn.Conv1d(channels_out, channels_out, kernel_size, dilation=dilation)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(dropout)
        self.skip = nn.Conv1d(channels_in, channels_out, 1) if channels_in != channels_out else nn.Identity()

    def forward(self, x):  # x: (batch, channels, time); left padding keeps it causal
        h = self.drop(self.act(self.conv1(nn.functional.pad(x, (self.pad, 0)))))
        h = self.drop(self.act(self.conv2(nn.functional.pad(h, (self.pad, 0)))))
        return self.act(h + self.skip(x))


@register_model("tcn", inputs="sequence", hyperparameters=("hidden", "layers", "dropout", "kernel_size"))
class TCN(nn.Module):
    """Temporal convolutional network: dilated causal convolutions over (batch, window, n_features)."""

    def __init__(self, n_features: int, n_classes: int, hidden: int = 64, layers: int = 2,
                 dropout: float = 0.1, kernel_size: int = 3):
        super().__init__()
        blocks, width = [], n_features
        for i in range(layers):
            blocks.append(_CausalBlock(width, hidden, kernel_size, 2**i, dropout))
            width = hidden
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x):
        h = self.blocks(x.transpose(1, 2))
        return self.head(h[:, :, -1])
