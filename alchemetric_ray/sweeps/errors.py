"""What a sweep refuses with: one line for the user, as every ``UserError``."""

from __future__ import annotations

from alchemetric_ray.errors import UserError


class SweepError(UserError, RuntimeError):
    pass
