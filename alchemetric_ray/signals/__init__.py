"""Signals: batch prediction with Ray Data, and an honest evaluation against baselines."""
