"""The ServerApp: taciturn's round loop (experiments/runner.py) with the clients on SuperNodes.

Flower starts it (``flwr run``) with the run config of settings.py; it writes the same run
directory as ``taciturn run`` (config, metrics, ledger with wire bytes, checkpoints, report), so
``taciturn report`` and ``taciturn compare`` read a deployed run and its simulation alike.
"""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from taciturn.deploy.grid_executor import GridExecutor
from taciturn.deploy.settings import ServerSettings
from taciturn.report.rundir import RunDir

app = ServerApp()


def run_deployed(grid: Grid, settings: ServerSettings, progress: bool = False) -> RunDir:
    """Run ``settings.config`` with its clients behind ``grid``; write the run directory and report."""
    from taciturn.experiments import types

    secagg = settings.config.secagg if settings.config.secagg.enabled else None
    return types.start(
        settings.config,
        settings.out,
        overwrite=settings.overwrite,
        progress=progress,
        remote=lambda pipeline: GridExecutor(
            pipeline, grid, settings.round_timeout, secagg, settings.min_nodes
        ),
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_deployed(grid, ServerSettings.from_run_config(context.run_config))
