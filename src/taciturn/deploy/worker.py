"""A long-lived ClientApp for a SuperNode started with ``--isolation process``.

By default a SuperNode runs each message's ClientApp in a new process (``--isolation subprocess``:
its SuperExec starts ``flwr-clientapp`` per message), which costs a Python start, the imports of
torch and taciturn and reading the node's data, every round. With ``--isolation process`` the
SuperNode leaves that to a process outside it, which claims the pending tasks from the SuperNode's
runtime API (``AcquireTask``) as Flower's SuperExec does. This worker is that process: it stays up,
keeps what client_app.py builds (the run's model, the node's data) in memory, and serves every
task in turn with Flower's own runtime API client and task protocol, as ``flwr-clientapp`` does
(flwr/supernode/runtime/run_clientapp.py: pull the task input, call the ClientApp, push the reply,
push the task's output). The transport is Flower's; nothing of it is taciturn's. Flower 1.42's
SuperNode still polls the SuperLink every 3 s while it has nothing to do, which bounds how short a
deployed round can be whatever runs the ClientApp.

It runs taciturn's ClientApp only: a run whose app folder names another ClientApp is answered with
an error, so a node started this way never imports code a run names.
"""

from __future__ import annotations

import logging
import threading
import time

import httpx
from flwr.app import Error, Message
from flwr.common.config import get_fab_config
from flwr.common.constant import ErrorCode, SubStatus
from flwr.common.serde import context_from_proto, fab_from_proto
from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
    AcquireTaskRequest,
    PullAppMessagesRequest,
    PullTaskInputRequest,
    SendTaskHeartbeatRequest,
)
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender
from flwr.supercore.inflatable.inflatable_protobuf_utils import (
    make_confirm_message_received_fn_protobuf,
    make_pull_object_fn_protobuf,
)
from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
from flwr.supercore.retry import RetryInvoker, exponential
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.task_identity import TaskIdentity
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

from taciturn.deploy import client_app
from taciturn.deploy.settings import DeployError

log = logging.getLogger(__name__)

# Between AcquireTask calls while the SuperNode has nothing pending: a message reaches the SuperNode
# at most every 3 s (its own poll of the SuperLink), so 0.1 s adds little to a round, and ten idle
# nodes on one machine stay quiet (0.02 s kept two cores busy answering polls).
POLL_S = 0.1
APPS = {
    "taciturn.deploy.client_app:app": client_app.app,
    "taciturn.deploy.client_app:secagg_app": client_app.secagg_app,
}


def _retrying(max_time: float | None) -> RetryInvoker:
    """Retries on transport errors only: no signal to this process on an HTTP error (Flower's
    default invoker interrupts its own process on 401, right for a one-shot flwr-clientapp, not
    for a worker that outlives any one task)."""
    return RetryInvoker(
        lambda: exponential(max_delay=2.0),
        httpx.TransportError,
        max_tries=None if max_time else 1,
        max_time=max_time,
    )


def _client(address: str, component: str, token: str | None = None, max_time: float | None = None):
    interceptors = [RuntimeVersionHttpInterceptor(component_name=component)]
    if token is not None:
        interceptors.append(RuntimeTokenHttpInterceptor(token))
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,  # the runtime API listens on the node's own loopback (--port)
        root_certificates=None,
        interceptors=interceptors,
        retry_invoker=_retrying(max_time),
    )


def clientapp_of(fab) -> object:
    """taciturn's ClientApp the run's app folder names (app_folder.py), or a refusal."""
    reference = get_fab_config(fab.content)["tool"]["flwr"]["app"]["components"].get("clientapp", "")
    if reference not in APPS:
        raise DeployError(
            f"this node runs taciturn's ClientApp only (taciturn deploy node); the run names {reference!r}"
        )
    return APPS[reference]


def serve_task(address: str, token: str) -> None:
    """One task of the SuperNode at ``address``, claimed with ``token``: as flwr-clientapp does."""
    client = _client(address, "flwr-clientapp", token, max_time=60.0)
    request = SendTaskHeartbeatRequest()

    def heartbeat() -> bool:
        try:
            return client.SendTaskHeartbeat(request).success
        except httpx.HTTPError:
            return False

    beat = HeartbeatSender(heartbeat)
    beat.start()
    message = reply = context = None
    status, details = SubStatus.FAILED, "the ClientApp failed"
    try:
        message, context, fab = task_input(client)
        reply = clientapp_of(fab)(message=message, context=context)
        status, details = SubStatus.COMPLETED, ""
    except Exception as error:  # an error reply, as flwr-clientapp sends: the server sees why
        log.error("the ClientApp raised %s: %s", type(error).__name__, error)
        details = f"{type(error).__name__}: {error}"
        if message is not None:
            reply = Message(
                Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details), reply_to=message
            )
    finally:
        try:
            if reply is not None and context is not None:
                push_message(client, reply, context)
        except (httpx.HTTPError, RuntimeError) as error:
            log.error("could not push the reply: %s", error)
        push_task_output(client, context, status, details)
        if beat.is_running:
            beat.stop()
        client.close()


def task_input(client: RuntimeHttpClient, timeout: float = 60.0):
    """The task's message, context and FAB, as flwr-clientapp's ``pull_task_input`` gets them, but
    waiting for the message: a SuperNode creates a task before it stores the task's message, and a
    worker that stays up claims tasks faster than a new flwr-clientapp process ever could."""
    started = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id = started.task_id
    TaskIdentity.run_id = started.run.run_id
    TaskIdentity.node_id = started.context.node_id
    context = context_from_proto(started.context)
    deadline = time.monotonic() + timeout
    while not (pulled := client.PullMessages(PullAppMessagesRequest())).messages_list:
        if time.monotonic() > deadline:
            raise DeployError(f"the SuperNode gave a task but no message in {timeout:g} s")
        time.sleep(POLL_S)
    node, tree = Node(node_id=context.node_id), pulled.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree,
        make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node, context.run_id),
        return_type=Message,
    )
    message.metadata.__dict__["_message_id"] = tree.object_id  # as flwr-clientapp sets it
    return message, context, fab_from_proto(started.fab)


def serve(address: str, stop: threading.Event) -> None:
    """Claim and serve the SuperNode's ClientApp tasks until ``stop`` is set; while the SuperNode
    is down (restarting), wait for it."""
    acquire = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
    client = _client(address, "SuperExec")
    try:
        while not stop.is_set():
            try:
                claimed = client.AcquireTask(acquire)
            except httpx.HTTPError:  # the SuperNode is (re)starting
                stop.wait(0.5)
                continue
            if claimed.HasField("task") and claimed.token:
                try:
                    serve_task(address, claimed.token)
                except Exception as error:  # one task's trouble must not end the node's service
                    log.error("task %d: %s: %s", claimed.task.task_id, type(error).__name__, error)
            else:
                stop.wait(POLL_S)
    finally:
        client.close()
