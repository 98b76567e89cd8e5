"""``[attack]``: which clients attack and how."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from taciturn.algorithms.base import StrictModel

AttackKind = Literal["sign_flip", "scale", "gaussian", "label_flip", "little_is_enough", "weight_lie"]


class AttackConfig(StrictModel):
    kind: AttackKind | None = Field(None, description="the attack (None: every client is honest)")
    fraction: float = Field(0.0, ge=0, le=1, description="fraction of all clients that attack (seeded)")
    strength: float | None = Field(
        None,
        description="sign_flip: -s x update (default 1); scale: s x update (default 100); gaussian, "
        "weight_lie: std of the noise sent (default 1); little_is_enough: z (default: Baruch et al.'s "
        "z_max); label_flip: unused",
    )

    @property
    def active(self) -> bool:
        return self.kind is not None and self.fraction > 0

    @property
    def colluding(self) -> bool:
        """The attackers read the round's honest updates, so all of them must be in one process."""
        return self.active and self.kind == "little_is_enough"
