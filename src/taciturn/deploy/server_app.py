"""The ServerApp: taciturn's round loop (experiments/runner.py) with the clients on SuperNodes.

Flower starts it (``flwr run``) with the run config of settings.py; it writes the same run
directory as ``taciturn run`` (config, metrics, ledger with wire bytes, checkpoints, report), so
``taciturn report`` and ``taciturn compare`` read a deployed run and its simulation alike. With
``resume = true`` it continues the run in ``out`` from its last checkpoint, with the nodes' client
states as they were then (node_state.py): the run ends with the numbers of an uninterrupted one.

What the operator watches reaches ``flwr run --stream``: taciturn's log (the run directory, each
round's progress and evaluation, every warning about a node) goes to the ServerApp's output, which
Flower forwards; a run that cannot go on raises, so Flower marks it failed and streams the error.
"""

from __future__ import annotations

import logging
import sys

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from taciturn.deploy.grid_executor import Floor, GridExecutor
from taciturn.deploy.nodes import Nodes
from taciturn.deploy.settings import DeployError, ServerSettings
from taciturn.engine.pipeline import ClientPipeline
from taciturn.experiments.clients import Census, Population, population_of
from taciturn.report.rundir import RunDir

app = ServerApp()
log = logging.getLogger("taciturn")


class Deployment:
    """What the round loop needs of a deployment (experiments/runner.py ``remote``): the clients'
    data as the nodes describe it (experiments/clients.py ``Nodes``) and the executor."""

    def __init__(self, grid: Grid, settings: ServerSettings, sizes: list[int] | None = None):
        self.settings = settings
        config = settings.config
        self.secagg = config.secagg if config.secagg.enabled else None
        self.nodes = Nodes(grid, settings.round_timeout, settings.min_nodes, self.secagg is not None)
        self.sizes = sizes  # a resumed run's clients' sizes, which the nodes must still have
        self.census_: Census | None = None

    def census(self, config) -> Census:
        self.census_ = self.nodes.census(self.sizes)
        return self.census_

    def evaluate(self, params, population: Population):
        return self.nodes.evaluate(params, population)

    def __call__(self, pipeline: ClientPipeline) -> GridExecutor:
        population = ()
        if self.census_ is not None:
            classes = self.census_.schema.classes
            population = population_of(self.settings.config, pipeline.data, classes).fields()
        floor = Floor(self.settings.min_trained, self.settings.patience)
        return GridExecutor(pipeline, self.nodes, self.secagg, floor, population)


def run_deployed(grid: Grid, settings: ServerSettings, progress: bool = False) -> RunDir:
    """Run ``settings.config`` with its clients behind ``grid`` (or continue it: ``resume``); write
    the run directory and report."""
    from taciturn.experiments import types
    from taciturn.experiments.config import load_config

    config = settings.config
    log.info("run %s: the run directory is %s on this server", config.name, settings.out)
    if not settings.resume:
        deployment = Deployment(grid, settings)
        return types.start(
            config, settings.out, overwrite=settings.overwrite, progress=progress, remote=deployment
        )
    rundir = RunDir(settings.out).require()
    if load_config(rundir.config) != config:
        raise DeployError(
            f"{settings.out} holds a run of another config than this run's taciturn-config; resume it "
            "with the config it was started with"
        )
    sizes = rundir.read_info().get("client_sizes")
    # the config was just checked to be the app's own (the operator's), so its code may run
    return types.resume(
        settings.out, progress=progress, remote=Deployment(grid, settings, sizes), trust_code=True
    )


def _stream_handler() -> logging.Handler:
    """taciturn's log on the ServerApp's stderr, which Flower forwards to `flwr run --stream`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("taciturn %(levelname)s: %(message)s"))
    handler.setLevel(logging.INFO)
    return handler


@app.main()
def main(grid: Grid, context: Context) -> None:
    handler = _stream_handler()
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        run_deployed(grid, ServerSettings.from_run_config(context.run_config))
    except Exception as error:  # Flower marks the run failed; the stream says why, in one line first
        log.error("the run failed: %s: %s", type(error).__name__, error)
        raise
    finally:
        log.removeHandler(handler)
