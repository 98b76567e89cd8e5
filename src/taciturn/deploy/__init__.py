"""Real federations on Flower's deployment runtime (optional extra ``taciturn[flower]``).

The same algorithm files run between machines: a Flower ServerApp (server_app.py) drives the
round loop of experiments/runner.py with an executor that sends each picked client's downlink
through Flower's Grid (grid_executor.py); a ClientApp on each SuperNode (client_app.py) runs
``client_begin`` / local training / ``client_end`` on the node's own data and keeps the node's
client state on its own disk (node_state.py). taciturn's safetensors payloads travel inside
Flower records (protocol.py): no pickle on any wire. Transport, TLS and node authentication are
Flower's (SuperLink / SuperNode flags); certs.py makes a test CA for them.
"""
