"""The parallel executor: a round's clients spread over worker processes, one thread each.

Workers are forked once, after the data is loaded, so they share the training set with the main
process page for page (nothing is copied or pickled). Each round, a worker receives its share of
the clients (balanced greedily by data size, like pfl-research's load balancer) and the downlink
messages, runs the same client pipeline as the sequential executor, and returns one partial
aggregate (``algorithm.accumulate``: for FedAvg a single weighted sum), its ledger rows and its
report. So the traffic between processes is one reduction per worker per round, not one update
per client. After the server has aggregated, each worker is told which clients' uplinks were
accepted and stores their staged state (the commit protocol, engine/executor.py). Everything
crosses the process boundary through the codec (safetensors) or JSON: nothing is pickled. Clients
with persistent state need a store the workers can share (``DiskStateStore``).

Within a worker the computation is the sequential executor's (or, with ``vectorized``, the
vectorized executor's); the partial sums are added in another order, so results agree with the
sequential executor up to floating-point rounding.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import traceback
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection

import torch

from taciturn.algorithms.base import ArraySpec
from taciturn.core.channel import Channel
from taciturn.core.codec import decode, encode
from taciturn.core.ledger import Direction, Ledger
from taciturn.core.message import Message
from taciturn.engine.executor import Executor, LoopTrainer
from taciturn.engine.pipeline import ClientPipeline, RoundPart, Trainer, merge
from taciturn.engine.wire import decode_part, decode_spec, encode_part, encode_spec

log = logging.getLogger(__name__)


class WorkerFailed(RuntimeError):
    """A worker process raised outside any single client's work (a bug, not a client fault)."""


class ParallelExecutor(Executor):
    """``vectorized``: each worker trains its share all at once (engine/vectorized.py) instead of
    one client after another; for plain FedAvg on a ReLU MLP that is the exact low-rank algebra of
    engine/lowrank.py, whose large shared products then run on every core."""

    def __init__(self, pipeline: ClientPipeline, workers: int, vectorized: bool = False):
        super().__init__(pipeline)
        self.name = "parallel_vectorized" if vectorized else "parallel"
        self.vectorized = vectorized
        if pipeline.algorithm.keeps_client_state and not pipeline.store.shared:
            raise ValueError(
                f"{pipeline.algorithm.name} keeps client state, which the parallel executor's workers can "
                "only share through a disk store: set engine.store = 'disk' (or 'auto')"
            )
        if workers < 1:
            raise ValueError(f"the parallel executor needs at least one worker, got {workers}")
        self.num_workers = workers
        self._workers: list[tuple[multiprocessing.Process, Connection]] = []

    def _start_workers(self) -> None:
        """Fork at the first round, so workers inherit everything the server set up (data, and what
        init_server told the algorithm, such as Ferret's initial model), copy-on-write."""
        context = multiprocessing.get_context("fork")
        for index in range(self.num_workers):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=_work,
                args=(theirs, self.pipeline, self.vectorized),
                name=f"taciturn-worker-{index}",
                daemon=True,
            )
            process.start()
            theirs.close()
            self._workers.append((process, ours))

    def serve(self, round, clients, downlink, spec) -> RoundPart:
        if not self._workers:
            self._start_workers()
        shares = balance(clients, [self.pipeline.data.client_size(c) for c in clients], len(self._workers))
        busy = [(conn, share) for (_, conn), share in zip(self._workers, shares, strict=True) if share]
        for conn, share in busy:
            _send_request(conn, round, share, downlink, spec)
        parts = [self._receive(conn) for conn, _ in busy]
        return merge(self.pipeline, parts, clients)

    def commit(self, round: int, accepted: Sequence[int]) -> None:
        """Every worker stores the staged state of its accepted clients in the shared store and
        answers once it has, so the store is complete when this returns (a checkpoint may follow)."""
        if not self.pipeline.algorithm.keeps_client_state:  # nothing was staged
            return
        request = json.dumps({"commit": round, "accepted": list(accepted)}).encode()
        for _, conn in self._workers:
            conn.send_bytes(request)
        for _, conn in self._workers:
            if "error" in (answer := json.loads(conn.recv_bytes())):
                raise WorkerFailed(answer["error"])

    def _receive(self, conn: Connection) -> RoundPart:
        header = json.loads(conn.recv_bytes())
        if "error" in header:
            raise WorkerFailed(header["error"])
        for row in header["ledger"]:
            self.pipeline.channel.ledger.add_row(row)
        return decode_part(header, [conn.recv_bytes() for _ in range(header["blobs"])])

    def close(self) -> None:
        for process, conn in self._workers:
            with contextlib.suppress(BrokenPipeError, OSError):
                conn.send_bytes(b"{}")  # an empty request: stop
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
        self._workers = []


def balance(clients: Sequence[int], sizes: Sequence[int], workers: int) -> list[list[int]]:
    """Greedy longest-processing-time split: each client (largest first) to the least-loaded worker."""
    loads, shares = [0] * workers, [[] for _ in range(workers)]
    for size, client in sorted(zip(sizes, clients, strict=True), key=lambda sc: (-sc[0], sc[1])):
        lightest = loads.index(min(loads))
        shares[lightest].append(client)
        loads[lightest] += size
    return [sorted(share, key=list(clients).index) for share in shares]


# ----- the wire between processes: JSON headers and codec blobs -----
def _send_request(
    conn: Connection,
    round: int,
    clients: list[int],
    downlink: Mapping[int, Message | None],
    spec: Mapping[str, ArraySpec],
) -> None:
    distinct: list[Message] = []
    which: dict[str, int | None] = {}
    for client in clients:
        message = downlink.get(client)
        if message is None:
            which[str(client)] = None
            continue
        index = next((i for i, m in enumerate(distinct) if m is message), None)  # a broadcast is sent once
        if index is None:
            distinct.append(message)
            index = len(distinct) - 1
        which[str(client)] = index
    header = {
        "round": round,
        "clients": clients,
        "downlink": which,
        "blobs": len(distinct),
        "spec": encode_spec(spec),
    }
    conn.send_bytes(json.dumps(header).encode())
    for message in distinct:
        conn.send_bytes(encode(message))


def _work(conn: Connection, pipeline: ClientPipeline, vectorized: bool) -> None:
    """A worker's loop: serve shares until told to stop."""
    torch.set_num_threads(1)
    logging.getLogger("taciturn").handlers.clear()  # the main process owns the run log
    drop = pipeline.channel.drop
    trainer: Trainer
    if vectorized:
        from taciturn.engine.vectorized import VmapTrainer

        trainer = VmapTrainer()
    else:
        trainer = LoopTrainer()
    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        if not request:
            return
        if "commit" in request:
            try:
                pipeline.commit(request["commit"], request["accepted"])
                answer = {"committed": request["commit"]}
            except Exception:
                answer = {"error": f"worker {os.getpid()}: {traceback.format_exc()}"}
            conn.send_bytes(json.dumps(answer).encode())
            continue
        try:
            messages = [decode(conn.recv_bytes()) for _ in range(request["blobs"])]
            downlink = {int(c): None if i is None else messages[i] for c, i in request["downlink"].items()}
            pipeline.channel = Channel(Ledger(), pipeline.streams, drop[Direction.UP], drop[Direction.DOWN])
            spec = decode_spec(request["spec"])
            part = pipeline.serve(request["round"], request["clients"], downlink, spec, trainer)
            header, blobs = encode_part(part, pipeline.channel.ledger.rows())
        except Exception:
            conn.send_bytes(json.dumps({"error": f"worker {os.getpid()}: {traceback.format_exc()}"}).encode())
            continue
        conn.send_bytes(json.dumps(header).encode())
        for blob in blobs:
            conn.send_bytes(blob)
