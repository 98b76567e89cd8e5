"""Multi-agent linear bandits: agents that decide, from data, whose samples to use.

environments / ratings   linear and ratings-matrix environments (finite arms, Gaussian noise)
linucb / stats           ridge statistics, confidence radius, the optimistic arm choice
separation               BASS's bias-vs-uncertainty test and the exact ellipsoid-overlap test
rules/                   who uses whose samples: BASS, independent, pooled, oracle, CLUB, SCLUB, DynUCB
exchange                 samples and pools as Messages through the core Channel and Ledger
simulation               the asynchronous protocol, vectorised over independent runs
metrics                  cluster-recovery F1
"""
