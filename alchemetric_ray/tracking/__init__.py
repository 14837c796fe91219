"""Where a run is logged: MLflow runs and the model registry (``mlflow_runs``, the only module that
imports ``mlflow``, lazily) and TensorBoard event files (``tensorboard``)."""
