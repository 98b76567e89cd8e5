"""The ServerApp: taciturn's round loop (experiments/runner.py) with the clients on SuperNodes.

Flower starts it (``flwr run``) with the run config of settings.py; it writes the same run
directory as ``taciturn run`` (config, metrics, ledger with wire bytes, checkpoints, report), so
``taciturn report`` and ``taciturn compare`` read a deployed run and its simulation alike. With
``resume = true`` it continues the run in ``out`` from its last checkpoint, with the nodes' client
states as they were then (node_state.py): the run ends with the numbers of an uninterrupted one.
"""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from taciturn.deploy.grid_executor import GridExecutor
from taciturn.deploy.settings import DeployError, ServerSettings
from taciturn.report.rundir import RunDir

app = ServerApp()


def run_deployed(grid: Grid, settings: ServerSettings, progress: bool = False) -> RunDir:
    """Run ``settings.config`` with its clients behind ``grid`` (or continue it: ``resume``); write
    the run directory and report."""
    from taciturn.experiments import types
    from taciturn.experiments.config import load_config

    config = settings.config
    secagg = config.secagg if config.secagg.enabled else None

    def remote(pipeline):
        return GridExecutor(pipeline, grid, settings.round_timeout, secagg, settings.min_nodes)

    if not settings.resume:
        return types.start(
            config, settings.out, overwrite=settings.overwrite, progress=progress, remote=remote
        )
    rundir = RunDir(settings.out).require()
    if load_config(rundir.config) != config:
        raise DeployError(
            f"{settings.out} holds a run of another config than this run's taciturn-config; resume it "
            "with the config it was started with"
        )
    # the config was just checked to be the app's own (the operator's), so its code may run
    return types.resume(settings.out, progress=progress, remote=remote, trust_code=True)


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_deployed(grid, ServerSettings.from_run_config(context.run_config))
