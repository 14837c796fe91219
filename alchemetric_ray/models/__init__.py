"""Plain nn.Modules that return class logits, chosen by name. No Ray and no device logic here.

Adding a model: one file with an ``nn.Module`` and one ``register(...)`` line below.
"""

from alchemetric_ray.models.registry import MODELS, ModelSpec, build_model, model_spec, register
from alchemetric_ray.models.mlp import MLP
from alchemetric_ray.models.recurrent import GRUClassifier, LSTMClassifier
from alchemetric_ray.models.tcn import TCN
from alchemetric_ray.models.transformer import TransformerClassifier

register("mlp", MLP, "tabular")
register("lstm", LSTMClassifier, "sequence")
register("gru", GRUClassifier, "sequence")
register("transformer", TransformerClassifier, "sequence")
register("tcn", TCN, "sequence")

__all__ = ["MODELS", "ModelSpec", "build_model", "model_spec", "register"]
