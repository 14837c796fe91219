"""Ray Tune sweeps over the same training loop, with TensorBoard logs and a static HTML report."""
