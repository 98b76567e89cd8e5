"""SecAgg's four rounds between the round's clients and the server, every message through the
Channel, so the Ledger counts each one and channel drops are client dropouts.

Bonawitz, Ivanov, Kreuter, Marcedone, McMahan, Patel, Ramage, Segal, Seth, "Practical Secure
Aggregation for Privacy-Preserving Machine Learning", CCS 2017, Fig. 4 (semi-honest protocol):
0. AdvertiseKeys: client u sends (c_u^PK, s_u^PK); the server sends every client its
   neighbours' keys.
1. ShareKeys: u draws a self-mask seed b_u, splits s_u^SK and b_u into t-of-k Shamir shares, one
   per neighbour v, encrypted under KA(c_u^SK, c_v^PK); the server routes them.
2. MaskedInputCollection: u sends y_u = x_u + PRG(b_u) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)
   (mod 2^32), s_uv = KA(s_u^SK, s_v^PK), over its neighbours v that shared keys.
3. Unmasking: the server names the neighbours that sent y (alive) and those that did not
   (dropped); u returns its shares of b_v for alive v and of s_v^SK for dropped v. The server
   rebuilds each b_v and removes PRG(b_v); rebuilds each dropped s_v^SK and removes the pairwise
   masks the survivors added for v. What remains is sum_{alive} x_u, exactly, mod 2^32.
SecAgg+ (Bell, Bonawitz, Gascon, Lepoint, Raykova, CCS 2020, Sec. 3) replaces the complete graph
by a sparse one: a Harary graph H(n, k) on a random relabelling of the clients (their Alg. 2),
k neighbours each, so keys, shares and masks grow with log n instead of n.

Secrets: key pairs, self-mask seeds and nonces come from the OS CSPRNG (crypto.py), never from
the run seed, which is public. The run still repeats exactly: the unmasked sum does not depend on
the keys, and what may vary (who drops, the SecAgg+ graph) comes from the seeded streams, since
a simulated dropout or a public graph is no secret.

Dropouts (Bonawitz et al. 2017, Sec. 4: any client may drop at any point): every message crosses
the channel on its own, so any stage can lose any client. A client the server no longer hears
from is dropped from then on; the sum is unmasked from the survivors' shares, or, when too few
shares arrive to rebuild a secret, or fewer than two masked inputs (the sum of one input is that
input), the round fails with ``SecAggFailed`` and the pipeline skips its update.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from taciturn.core.channel import Channel
from taciturn.core.ledger import Direction
from taciturn.core.message import Message
from taciturn.core.rng import SERVER, Streams
from taciturn.secagg import crypto
from taciturn.secagg.config import SecAggConfig, SecAggFailed

ID = 4  # bytes of a client id or share index in a plaintext


def harary(clients: list[int], k: int, rng: np.random.Generator) -> dict[int, list[int]]:
    """Bell et al. 2020, Alg. 2: H(n, k) on a random relabelling (k/2 ring neighbours each side)."""
    n = len(clients)
    if k >= n - 1:
        return {u: [v for v in clients if v != u] for u in clients}
    ring = [clients[i] for i in rng.permutation(n)]
    out: dict[int, set[int]] = {u: set() for u in clients}
    for i, u in enumerate(ring):
        for j in range(1, k // 2 + 1):
            v = ring[(i + j) % n]
            out[u].add(v)
            out[v].add(u)
    return {u: sorted(vs) for u, vs in out.items()}


def _bytes(rows: list[bytes]) -> np.ndarray:
    return (
        np.frombuffer(b"".join(rows), np.uint8).reshape(len(rows), -1) if rows else np.zeros((0, 0), np.uint8)
    )


def _ids(values: Collection[int]) -> np.ndarray:
    return np.array(sorted(values), np.int32)


class SecureSum:
    def __init__(self, config: SecAggConfig, streams: Streams):
        self.config, self.streams = config, streams

    def run(
        self,
        channel: Channel,
        round: int,
        inputs: Mapping[int, np.ndarray],
        silent_after_shares: Collection[int] = (),
    ) -> tuple[list[int], np.ndarray]:
        """The clients whose input is in the sum, and the sum mod 2^32 of their uint32 ``inputs``.
        ``silent_after_shares``: clients that drop out after the share round (tests, dropouts)."""
        self._send = channel.send
        clients = sorted(inputs)
        dim = len(next(iter(inputs.values())))
        k = self.config.neighbours if self.config.graph == "sparse" else len(clients) - 1
        graph = harary(clients, k, self.streams.numpy(round, SERVER, "secagg-graph"))
        keys = {u: (crypto.fresh_key(), crypto.fresh_key()) for u in clients}  # (c_u, s_u)
        # 0. AdvertiseKeys
        public: dict[int, tuple[bytes, bytes]] = {}
        for u in clients:
            c_pk, s_pk = (crypto.public_bytes(key) for key in keys[u])
            sent = Message({"c_pk": _bytes([c_pk]), "s_pk": _bytes([s_pk])}, {"secagg": "keys"})
            if (got := self._send(Direction.UP, round, u, sent)) is not None:
                public[u] = (got.arrays["c_pk"].tobytes(), got.arrays["s_pk"].tobytes())
        u1: dict[int, list[int]] = {}
        for u in public:
            peers = [v for v in graph[u] if v in public]
            down = Message(
                {
                    "ids": _ids(peers),
                    "c_pk": _bytes([public[v][0] for v in peers]),
                    "s_pk": _bytes([public[v][1] for v in peers]),
                },
                {"secagg": "peer_keys"},
            )
            if self._send(Direction.DOWN, round, u, down) is not None:
                u1[u] = peers
        # 1. ShareKeys
        thresholds, seeds, outbox = {}, {}, {}
        for u, peers in u1.items():
            seeds[u] = crypto.fresh_secret()
            t = thresholds[u] = int(self.config.threshold * len(peers)) + 1
            if len(peers) < max(t, 1):
                continue
            s_bytes = keys[u][1].private_bytes_raw()
            s_shares, b_shares = crypto.split(s_bytes, t, len(peers)), crypto.split(seeds[u], t, len(peers))
            rows = []
            for index, v in enumerate(peers):
                plain = (
                    b"".join(x.to_bytes(ID, "little") for x in (u, v, index + 1))
                    + s_shares[index]
                    + b_shares[index]
                )
                key = crypto.agree(keys[u][0], public[v][0], b"encrypt")
                rows.append(crypto.encrypt(key, crypto.fresh_secret(crypto.NONCE_BYTES), plain))
            got = self._send(
                Direction.UP, round, u, Message({"to": _ids(peers), "ct": _bytes(rows)}, {"secagg": "shares"})
            )
            if got is not None:
                outbox[u] = dict(zip(peers, rows, strict=True))
        held: dict[int, dict[int, tuple[int, bytes, bytes]]] = {}  # v -> {u: (index, s share, b share)}
        u2: dict[int, list[int]] = {}
        for v in outbox:
            senders = [u for u in u1[v] if u in outbox and v in outbox[u]]
            down = Message(
                {"from": _ids(senders), "ct": _bytes([outbox[u][v] for u in senders])}, {"secagg": "routed"}
            )
            got = self._send(Direction.DOWN, round, v, down)
            if got is None:
                continue
            held[v] = {}
            for u, ct in zip(got.arrays["from"].tolist(), got.arrays["ct"], strict=True):
                plain = crypto.decrypt(crypto.agree(keys[v][0], public[u][0], b"encrypt"), ct.tobytes())
                index = int.from_bytes(plain[2 * ID : 3 * ID], "little")
                body = plain[3 * ID :]
                held[v][u] = (index, body[: crypto.SHARE_BYTES], body[crypto.SHARE_BYTES :])
            u2[v] = senders  # the neighbours it masks with: those that shared keys with it
        # 2. MaskedInputCollection
        masked: dict[int, np.ndarray] = {}
        for u, peers in u2.items():
            if u in silent_after_shares:
                continue
            y = inputs[u].astype(np.uint32) + crypto.prg(seeds[u], dim)
            for v in peers:
                pad = crypto.prg(crypto.agree(keys[u][1], public[v][1], b"mask"), dim)
                y = y + pad if u < v else y - pad  # uint32: wraps mod 2^32
            if (
                got := self._send(Direction.UP, round, u, Message({"y": y}, {"secagg": "masked"}))
            ) is not None:
                masked[u] = got.arrays["y"]
        if len(masked) < 2:  # abort before any share is asked for (Fig. 4: the server needs enough inputs)
            raise SecAggFailed(
                f"{len(masked)} masked input(s) arrived; the sum of fewer than two inputs would reveal them"
            )
        # 3. Unmasking
        b_shares: dict[int, dict[int, bytes]] = {u: {} for u in masked}
        s_shares: dict[int, dict[int, bytes]] = {}
        for v in masked:
            alive = [u for u in u2[v] if u in masked]
            dropped = [u for u in u2[v] if u not in masked]
            ask = Message({"alive": _ids(alive), "dropped": _ids(dropped)}, {"secagg": "unmask_request"})
            got = self._send(Direction.DOWN, round, v, ask)
            if got is None:
                continue
            alive_ids, dropped_ids = got.arrays["alive"].tolist(), got.arrays["dropped"].tolist()
            # Fig. 4, Unmasking: a client answers only a request about its own neighbours, none of
            # them both alive and dropped (both shares of one client would unmask its input).
            if set(alive_ids) & set(dropped_ids) or not set(alive_ids) | set(dropped_ids) <= set(held[v]):
                continue
            reply = Message(
                {
                    "b_from": _ids(alive_ids),
                    "b": _bytes([held[v][u][0].to_bytes(ID, "little") + held[v][u][2] for u in alive_ids]),
                    "s_from": _ids(dropped_ids),
                    "s": _bytes([held[v][u][0].to_bytes(ID, "little") + held[v][u][1] for u in dropped_ids]),
                },
                {"secagg": "unmask"},
            )
            if (back := self._send(Direction.UP, round, v, reply)) is None:
                continue
            for kind, store in (("b", b_shares), ("s", s_shares)):
                for u, row in zip(back.arrays[f"{kind}_from"].tolist(), back.arrays[kind], strict=True):
                    store.setdefault(u, {})[int.from_bytes(row[:ID].tobytes(), "little")] = row[ID:].tobytes()
        total = np.zeros(dim, np.uint32)
        for u in sorted(masked):
            total += masked[u]
            total -= crypto.prg(self._rebuild(b_shares[u], thresholds[u], u), dim)
        for v, shares in s_shares.items():
            s_v = crypto.private_key(self._rebuild(shares, thresholds[v], v))
            for u in masked:
                if v in u2[u]:  # u masked with v (v may have dropped before it masked, or before u2)
                    pad = crypto.prg(crypto.agree(s_v, public[u][1], b"mask"), dim)
                    total = total - pad if u < v else total + pad  # undo what u added for v
        return sorted(masked), total

    @staticmethod
    def _rebuild(shares: dict[int, bytes], threshold: int, owner: int) -> bytes:
        if len(shares) < threshold:
            raise SecAggFailed(
                f"only {len(shares)} shares of client {owner}'s secret arrived; {threshold} needed"
            )
        return crypto.combine(dict(sorted(shares.items())[:threshold]))
