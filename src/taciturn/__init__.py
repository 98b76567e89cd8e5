"""taciturn: federated and collaborative learning that speaks only when it must.

Layers (imports point downward only)::

    cli / experiments   configs, runner, run directory, resume
    report              plots and the HTML report, read from a run directory
    engine              round loop and executors
    algorithms          FedAvg and the methods that share its shape
    tasks / data        datasets, partitioners, models, losses
    core                Message, codec, Channel, Ledger, RNG streams, client-state store
"""

__version__ = "0.1.0"
