"""Sharing rules: BASS and the baselines it is compared with."""

from taciturn.bandits.rules.base import SharingRule
from taciturn.bandits.rules.bass import Bass
from taciturn.bandits.rules.club import Club
from taciturn.bandits.rules.dynucb import DynUcb
from taciturn.bandits.rules.fixed import Independent, Oracle, Pooled
from taciturn.bandits.rules.sclub import Sclub

__all__ = ["Bass", "Club", "DynUcb", "Independent", "Oracle", "Pooled", "Sclub", "SharingRule"]
